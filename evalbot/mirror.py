"""A bare mirror of the judged repository, fetched fresh before every round of evaluations.

Main is always measured as the remote has it now (never a stale checkout), and a PR's head is fetched
by its pull ref or branch so that evaluate can extract both revisions. Only git runs here; no PR code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evalbot import git
from evalbot.evaluate import checkout

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
        try:
            return git.out(self.path, *args, timeout=timeout).strip()
        except git.GitError as exc:
            raise MirrorError(str(exc)) from exc

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
        try:
            return git.run(self.path, "cat-file", "-e", f"{sha}^{{commit}}", timeout=60).returncode == 0
        except git.GitError as exc:
            raise MirrorError(str(exc)) from exc

    def merge_commit(self, main_sha: str, head_sha: str) -> str | None:
        """The commit to measure for a PR, its head merged into main (checkout.merge_commit); None on conflict."""
        try:
            return checkout.merge_commit(self.path, main_sha, head_sha)
        except checkout.BuildError as exc:
            raise MirrorError(str(exc)) from exc

    def fetch_commit(self, sha: str, ref_hint: str | None = None) -> None:
        """Make sure a PR head is present: fetch everything again, then the hint ref, then the bare sha."""
        if self.has(sha):
            return
        self.fetch()
        for spec in ([ref_hint] if ref_hint else []) + [sha]:
            if self.has(sha):
                return
            try:
                git.run(self.path, "fetch", "-q", self.remote, spec)
            except git.GitError as exc:
                raise MirrorError(str(exc)) from exc
        if not self.has(sha):
            raise MirrorError(f"{self.remote} does not serve commit {sha} (ref {ref_hint or 'unknown'})")
