"""Real git behind the double: a bare repository whose commits are the PRs' head and base shas.

Commits are written with plumbing (no worktree), dated from the double's clock so shas are reproducible.
A PR registered here gets its files and patches from ``git diff`` and its commits from ``git log``, exactly
the facts GitHub derives, and merging it through the API really moves ``main``. An evaluator can fetch any
of these shas from ``repo.url`` (file://).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tests.github_double.state import CommitState, FileState, GitHubState, PullState

Person = tuple[str, str]  # (name, email)
MAINTAINER: Person = ("Main Tainer", "maintainer@example.com")
WEB_FLOW: Person = ("GitHub", "noreply@github.com")


class BareRepo:
    """A bare git repository driven with plumbing commands."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def url(self) -> str:
        """The file:// URL to clone or fetch from."""
        return self.path.resolve().as_uri()

    @classmethod
    def create(
        cls, path: Path, files: Mapping[str, str | bytes], when: int, author: Person = MAINTAINER
    ) -> BareRepo:
        """A new bare repository whose main branch holds ``files`` in one commit."""
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True, env=_env())
        repo = cls(path)
        repo.commit("main", files, "Initial commit", author=author, when=when)
        return repo

    def git(
        self, *args: str, env: Mapping[str, str] | None = None, stdin: bytes | None = None, strip: bool = True
    ) -> str:
        """Run git in the repository and return its stdout (stripped); a failure raises with git's stderr."""
        done = subprocess.run(
            ["git", "--git-dir", str(self.path), *args], input=stdin, capture_output=True, env=_env(env)
        )
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
        out = done.stdout.decode()
        return out.strip() if strip else out

    def rev(self, ref: str) -> str:
        """The sha a ref or revision names."""
        return self.git("rev-parse", "--verify", f"{ref}^{{commit}}")

    def commit(
        self,
        branch: str,
        files: Mapping[str, str | bytes | None],
        message: str,
        *,
        author: Person,
        when: int,
        start: str = "main",
        committer: Person | None = None,
    ) -> str:
        """Commit ``files`` (None deletes) on ``branch``, creating it from ``start``; returns the sha."""
        heads = self.git("for-each-ref", "--format=%(refname:short)", "refs/heads/").split()
        parent = self.rev(branch) if branch in heads else (self.rev(start) if start in heads else None)
        with tempfile.TemporaryDirectory() as tmp:
            index = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
            if parent:
                self.git("read-tree", parent, env=index)
            for path, content in files.items():
                if content is None:
                    # --index-info with a zero mode drops the entry; --force-remove would want a worktree
                    self.git(
                        "update-index", "--index-info", env=index, stdin=f"0 {'0' * 40}\t{path}\n".encode()
                    )
                    continue
                data = content.encode() if isinstance(content, str) else content
                blob = self.git("hash-object", "-w", "--stdin", stdin=data)
                self.git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", env=index)
            tree = self.git("write-tree", env=index)
        sha = self.git(
            "commit-tree",
            tree,
            *(["-p", parent] if parent else []),
            "-m",
            message,
            env=_people(author, committer or author, when),
        )
        self.git("update-ref", f"refs/heads/{branch}", sha)
        return sha

    def pull_files(self, base: str, head: str) -> list[FileState]:
        """The PR's changed files as GitHub lists them: against the merge base, renames found, hunks only."""
        diff = self.git(
            "-c",
            "core.quotePath=false",
            "diff",
            "--no-color",
            "--find-renames",
            f"{base}...{head}",
            strip=False,
        )
        return [_file(chunk) for chunk in re.split(r"^diff --git ", diff, flags=re.M)[1:]]

    def pull_commits(self, base: str, head: str) -> list[CommitState]:
        """The PR's commits, oldest first, with git's recorded names and emails."""
        fmt = "%x1f".join(["%H", "%P", "%an", "%ae", "%aI", "%cn", "%ce", "%cI", "%B"]) + "%x1e"
        out = []
        for record in self.git("log", "--reverse", f"--format={fmt}", f"{base}..{head}").split("\x1e"):
            if not record.strip():
                continue
            sha, parents, an, ae, ad, cn, ce, cd, message = record.strip("\n").split("\x1f")
            out.append(CommitState(sha, message.strip(), an, ae, cn, ce, _utc(ad), _utc(cd), parents.split()))
        return out

    def merge(self, pull: PullState, method: str, title: str, message: str) -> str:
        """Merge the PR's head into its base branch as GitHub would (merge commit or squash); returns the sha."""
        base = self.rev(pull.base_ref)
        done = subprocess.run(
            ["git", "--git-dir", str(self.path), "merge-tree", "--write-tree", "--name-only", base, pull.head_sha],
            capture_output=True, env=_env(),
        )  # fmt: skip
        if done.returncode == 1:
            conflicted = done.stdout.decode().split("\n\n")[0].splitlines()[1:]
            raise ValueError(f"merge conflict in {', '.join(conflicted) or 'the tree'}")
        if done.returncode != 0:
            raise RuntimeError(f"git merge-tree failed: {done.stderr.decode(errors='replace').strip()}")
        tree = done.stdout.decode().splitlines()[0]
        parents = ["-p", base] + (["-p", pull.head_sha] if method == "merge" else [])
        when = int(self.git("log", "-1", "--format=%ct", pull.head_sha)) + 1
        text = f"{title}\n\n{message}".strip()
        sha = self.git("commit-tree", tree, *parents, "-m", text, env=_people(WEB_FLOW, WEB_FLOW, when))
        self.git("update-ref", f"refs/heads/{pull.base_ref}", sha, base)
        return sha


def add_git_pull(
    state: GitHubState,
    repo: BareRepo,
    number: int,
    files: Mapping[str, str | bytes | None],
    *,
    author_login: str = "octo",
    author: Person = ("Octo Cat", "octo@example.com"),
    title: str | None = None,
    body: str | None = None,
    message: str | None = None,
) -> PullState:
    """Commit ``files`` on a new branch off main and register it as an open PR with real shas and patches."""
    branch = f"pr-{number}"
    base = repo.rev("main")
    head = repo.commit(branch, files, message or f"Change for #{number}", author=author, when=state.tick())
    with state.lock:
        state.users_by_email[author[1]] = author_login
        state.clone_url = repo.url
        state.refs["main"] = base
        pull = state.add_pull(
            number,
            author=author_login,
            head_sha=head,
            head_ref=branch,
            base_sha=base,
            title=title or f"Speed up #{number}",
            body=body if body is not None else f"Makes decode faster ({number}).",
            files=repo.pull_files(base, head),
            commits=repo.pull_commits(base, head),
        )
        pull.merger = repo.merge
        return pull


def push_git_commit(
    state: GitHubState,
    repo: BareRepo,
    number: int,
    files: Mapping[str, str | bytes | None],
    message: str = "Follow-up",
    author: Person = ("Octo Cat", "octo@example.com"),
) -> str:
    """Commit on the PR's branch, as a push by its author, and update the PR; returns the new head sha."""
    pull = state.pulls[number]
    head = repo.commit(pull.head_ref, files, message, author=author, when=state.tick())
    state.push(
        number,
        head,
        commits=repo.pull_commits(pull.base_sha, head),
        files=repo.pull_files(pull.base_sha, head),
    )
    return head


def _file(chunk: str) -> FileState:
    lines = chunk.split("\n")
    status, old, new, at = "modified", None, None, len(lines)
    for i, line in enumerate(lines[1:], start=1):
        if line.startswith("@@"):
            at = i
            break
        if line.startswith("new file mode"):
            status = "added"
        elif line.startswith("deleted file mode"):
            status = "removed"
        elif line.startswith("rename from "):
            status, old = "renamed", line.removeprefix("rename from ")
        elif line.startswith("rename to "):
            new = line.removeprefix("rename to ")
        elif line.startswith("--- a/"):
            old = old or line.removeprefix("--- a/")
        elif line.startswith("+++ b/"):
            new = line.removeprefix("+++ b/")
    hunks = lines[at:]
    if hunks and hunks[-1] == "":  # the newline that ended this file's section, not a diff line
        hunks.pop()
    name = new or old or lines[0].split(" b/", 1)[-1]
    return FileState(
        filename=name,
        status=status,
        additions=sum(line.startswith("+") for line in hunks),
        deletions=sum(line.startswith("-") for line in hunks),
        patch="\n".join(hunks) or None,  # binary files and pure renames have no hunks
        previous_filename=old if status == "renamed" else None,
    )


def _utc(iso: str) -> str:
    return iso.replace("+00:00", "Z")


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # Isolated from the developer's git configuration, so hooks, signing or templates never interfere.
    base = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**base, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", **(extra or {})}


def _people(author: Person, committer: Person, when: int) -> dict[str, str]:
    date = f"@{when} +0000"
    return {
        "GIT_AUTHOR_NAME": author[0],
        "GIT_AUTHOR_EMAIL": author[1],
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": committer[0],
        "GIT_COMMITTER_EMAIL": committer[1],
        "GIT_COMMITTER_DATE": date,
    }
