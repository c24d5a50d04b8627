"""Checkout: ``git archive <sha>``, extracted with tarfile's ``data`` filter into ``root/<sha>``. We use
this rather than ``git worktree add`` because it writes nothing into the judged repository (no
``.git/worktrees`` entry to prune, no ``.git`` link in the checkout through which the revision's build
could reach the repository's objects or hooks). It works the same on bare and non-bare repositories
and on clones of ``file://`` remotes, and the filter refuses absolute paths and links that leave the tree.

Git runs through evalbot.git; a revision that cannot be resolved or checked out is a ``BuildError``.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from evalbot import git
from evalbot.evaluate.files import TMP_NAME, read_json, remove, write_json_atomic

_SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # sha1 or sha256 object names


class BuildError(RuntimeError):
    """A revision cannot be resolved or checked out; the message says which and why."""


@dataclass(frozen=True)
class Worktree:
    """A clean checkout of one commit: where it is, the rev asked for, and what it resolved to."""

    path: Path
    rev: str
    sha: str
    tree_sha: str


def _git_run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return git.run(repo, *args)
    except git.GitError as e:
        raise BuildError(str(e)) from e


def _git(repo: Path, *args: str) -> str:
    try:
        return git.out(repo, *args)
    except git.GitError as e:
        raise BuildError(str(e)) from e


def resolve(repo: Path, rev: str) -> tuple[str, str]:
    """(commit sha, tree sha) of rev in repo; BuildError if rev names no commit there."""
    # --end-of-options: a rev such as "--output=x" is a name, never an option.
    proc = _git_run(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if proc.returncode != 0:
        # --quiet leaves stderr empty for an unknown name; anything there is a different problem.
        if proc.stderr.strip():
            raise BuildError(f"cannot resolve {rev!r} in {repo}: {proc.stderr.strip()}")
        raise BuildError(f"unknown revision {rev!r} in {repo}")
    sha = proc.stdout.strip()
    tree_sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{sha}^{{tree}}").strip()
    if not _SHA.fullmatch(sha) or not _SHA.fullmatch(tree_sha):
        raise BuildError(f"git resolved {rev!r} to {sha!r} (tree {tree_sha!r}), which is not an object name")
    return sha, tree_sha


def changed_paths(repo: Path, base: str, head: str) -> list[str]:
    """Paths that head changes relative to its merge base with base (`git diff base...head`), sorted."""
    base_sha, _ = resolve(repo, base)
    head_sha, _ = resolve(repo, head)
    # --no-renames: a file moved out of a sensitive path must show up under its old name too.
    out = _git(repo, "diff", "--name-only", "-z", "--no-renames", f"{base_sha}...{head_sha}", "--")
    return sorted(p for p in out.split("\0") if p)


_MERGE_STAMP = "1970-01-01T00:00:00+0000"


def merge_commit(repo: Path, main_sha: str, head_sha: str) -> str | None:
    """The commit to measure for a PR: its head merged into main (what would land), or None on conflict.

    A head that already contains main is measured as it is. Otherwise the merge is made with `git
    merge-tree` and `git commit-tree` (an object in the repository, no ref, no work tree), fixed author
    and dates, so the commit is the same for the same (main, head) on every box.
    """
    if _git_run(repo, "merge-base", "--is-ancestor", main_sha, head_sha).returncode == 0:
        return head_sha
    merged = _git_run(repo, "merge-tree", "--write-tree", main_sha, head_sha)
    if merged.returncode == 1:
        return None  # conflicts
    if merged.returncode != 0:
        raise BuildError(
            f"git merge-tree {main_sha[:12]} {head_sha[:12]} failed in {repo}: "
            f"{merged.stderr.strip()[-500:] or 'no output'}"
        )
    tree = merged.stdout.split("\n", 1)[0].strip()
    env = {
        "GIT_AUTHOR_NAME": "evalbot", "GIT_AUTHOR_EMAIL": "evalbot@localhost", "GIT_AUTHOR_DATE": _MERGE_STAMP,
        "GIT_COMMITTER_NAME": "evalbot", "GIT_COMMITTER_EMAIL": "evalbot@localhost",
        "GIT_COMMITTER_DATE": _MERGE_STAMP,
    }  # fmt: skip
    try:
        made = git.run(
            repo,
            "commit-tree",
            tree,
            "-p",
            main_sha,
            "-p",
            head_sha,
            "-m",
            f"evalbot: {head_sha[:12]} merged into main {main_sha[:12]}",
            env=env,
        )
    except git.GitError as e:
        raise BuildError(str(e)) from e
    if made.returncode != 0 or not _SHA.fullmatch(made.stdout.strip()):
        raise BuildError(f"git commit-tree failed in {repo}: {made.stderr.strip()[-500:] or 'no output'}")
    return made.stdout.strip()


def prepare_worktree(repo: Path, rev: str, root: Path) -> Worktree:
    """Check out rev's tree into root/<sha>; a checkout already there is reused if intact."""
    sha, tree_sha = resolve(repo, rev)
    dest, marker = root / sha, root / f"{sha}.json"
    if _checkout_intact(dest, marker, sha, tree_sha):
        return Worktree(dest, rev, sha, tree_sha)
    root.mkdir(parents=True, exist_ok=True)
    remove(marker)
    remove(dest)
    tmp = root / f".tmp-{sha}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _extract(repo, sha, tmp)
        files = _tree_digest(tmp)
        tmp.rename(dest)
    finally:
        remove(tmp)
    # The marker comes last: a checkout without one is incomplete and is redone.
    write_json_atomic(marker, {"sha": sha, "tree_sha": tree_sha, "files": files})
    return Worktree(dest, rev, sha, tree_sha)


def cleanup_worktrees(root: Path, keep: Iterable[str] = ()) -> list[Path]:
    """Remove the checkouts (and leftovers) under root except the shas in keep; returns what was removed."""
    if not root.is_dir():
        return []
    keep = set(keep)
    removed = []
    for entry in sorted(root.iterdir()):
        stem = entry.name.removesuffix(".json")
        # Only names this module makes: root may be shared with other things.
        if (_SHA.fullmatch(stem) and stem not in keep) or TMP_NAME.fullmatch(entry.name):
            remove(entry)
            removed.append(entry)
    return removed


def remove_worktree(root: Path, sha: str) -> bool:
    """Remove one checkout (and its marker) made by prepare_worktree; whether there was one."""
    if not _SHA.fullmatch(sha):
        raise ValueError(f"sha: expected a 40-hex commit sha, got {sha!r}")
    found = False
    for entry in (root / sha, root / f"{sha}.json"):
        if entry.exists() or entry.is_symlink():
            remove(entry)
            found = True
    return found


def _extract(repo: Path, sha: str, dest: Path) -> None:
    try:
        proc = git.stream(repo, "archive", "--format=tar", sha)
    except git.GitError as e:
        raise BuildError(str(e)) from e
    assert proc.stdout is not None
    unsafe: Exception | None = None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(dest, filter="data")
    except tarfile.FilterError as e:
        unsafe = e
    except tarfile.TarError:
        pass  # git failed; its own message below says why
    finally:
        proc.stdout.close()
        stderr = git.read_stderr(proc)
        rc = proc.wait()
    if unsafe is not None:
        raise BuildError(f"{sha} cannot be checked out safely: {unsafe}")
    if rc != 0:
        raise BuildError(f"`git archive {sha}` failed in {repo}: {stderr or f'exit {rc}'}")


def _tree_digest(top: Path) -> dict[str, str]:
    """Every file under top (links not followed) -> its content hash, exec bit or link target."""
    out: dict[str, str] = {}
    stack = [top]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                rel = Path(entry.path).relative_to(top).as_posix()
                if entry.is_symlink():
                    out[rel] = "link:" + os.readlink(entry.path)
                elif entry.is_dir():
                    stack.append(Path(entry.path))
                else:
                    digest = hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()
                    out[rel] = ("x" if os.access(entry.path, os.X_OK) else "f") + ":" + digest
    return dict(sorted(out.items()))


def _checkout_intact(dest: Path, marker: Path, sha: str, tree_sha: str) -> bool:
    meta = read_json(marker)
    if not meta or meta.get("sha") != sha or meta.get("tree_sha") != tree_sha or not dest.is_dir():
        return False
    # Exact file set: an added file (say engine/extra.py) would be built too.
    return _tree_digest(dest) == meta.get("files")
