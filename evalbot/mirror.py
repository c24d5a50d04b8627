"""A bare mirror of the judged repository, fetched fresh before every round of evaluations.

Main is always measured as the remote has it now (never a stale checkout), and a PR's head is fetched
by its pull ref or branch so that evaluate can extract both revisions. Only git runs here; no PR code.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# GitHub serves every PR's head as refs/pull/N/head (forks included); same-repo branches come too,
# for remotes that have no pull refs (a plain bare repository).
_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/pull/*/head:refs/pull/*/head")


class MirrorError(RuntimeError):
    """git could not fetch: an infrastructure fault, never a contributor's."""


@dataclass(frozen=True)
class Mirror:
    """A bare clone at `path` of `remote`."""

    remote: str
    path: Path

    def _git(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise MirrorError(f"git {' '.join(args[:2])} in {self.path}: {proc.stderr.strip()[-500:]}")
        return proc.stdout.strip()

    def fetch(self) -> None:
        """Create the mirror if needed and fetch every branch and pull ref (pruning deleted ones)."""
        if not (self.path / "HEAD").exists():
            self.path.mkdir(parents=True, exist_ok=True)
            self._git("init", "-q", "--bare")
        self._git("fetch", "-q", "--prune", "--force", self.remote, *_REFSPECS)

    def sha(self, ref: str) -> str:
        """The commit a branch or ref names in the mirror."""
        return self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")

    def has(self, sha: str) -> bool:
        """Whether the mirror holds this commit."""
        proc = subprocess.run(["git", "-C", str(self.path), "cat-file", "-e", f"{sha}^{{commit}}"],
                              capture_output=True, timeout=60)  # fmt: skip
        return proc.returncode == 0

    def merge_commit(self, main_sha: str, head_sha: str) -> str | None:
        """The commit to measure for a PR: its head merged into main (what would land), or None on conflict.

        A head that already contains main is measured as it is. Otherwise the merge is made in the
        mirror (`git merge-tree`), so a PR opened on an older main is measured against the current one
        and credited only for what it adds to it. The commit is deterministic for (main, head).
        """
        ancestor = subprocess.run(["git", "-C", str(self.path), "merge-base", "--is-ancestor", main_sha, head_sha],
                                  capture_output=True, timeout=120)  # fmt: skip
        if ancestor.returncode == 0:
            return head_sha
        merged = subprocess.run(["git", "-C", str(self.path), "merge-tree", "--write-tree", main_sha, head_sha],
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        if merged.returncode == 1:
            return None  # conflicts
        if merged.returncode != 0:
            raise MirrorError(
                f"git merge-tree {main_sha[:12]} {head_sha[:12]}: {merged.stderr.strip()[-500:]}"
            )
        tree = merged.stdout.split("\n", 1)[0].strip()
        stamp = "1970-01-01T00:00:00+0000"
        env = {"GIT_AUTHOR_NAME": "evalbot", "GIT_AUTHOR_EMAIL": "evalbot@localhost", "GIT_AUTHOR_DATE": stamp,
               "GIT_COMMITTER_NAME": "evalbot", "GIT_COMMITTER_EMAIL": "evalbot@localhost",
               "GIT_COMMITTER_DATE": stamp, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # fmt: skip
        made = subprocess.run(["git", "-C", str(self.path), "commit-tree", tree, "-p", main_sha, "-p", head_sha,
                               "-m", f"evalbot: {head_sha[:12]} merged into main {main_sha[:12]}"],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        if made.returncode != 0:
            raise MirrorError(f"git commit-tree: {made.stderr.strip()[-500:]}")
        return made.stdout.strip()

    def fetch_commit(self, sha: str, ref_hint: str | None = None) -> None:
        """Make sure a PR head is present: fetch everything again, then the hint ref, then the bare sha."""
        if self.has(sha):
            return
        self.fetch()
        for spec in ([ref_hint] if ref_hint else []) + [sha]:
            if self.has(sha):
                return
            subprocess.run(["git", "-C", str(self.path), "fetch", "-q", self.remote, spec], capture_output=True,
                           timeout=600)  # fmt: skip
        if not self.has(sha):
            raise MirrorError(f"{self.remote} does not serve commit {sha} (ref {ref_hint or 'unknown'})")
