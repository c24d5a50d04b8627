"""The GitHubPort protocol the rest of evalbot programs against, its errors and GitHub's limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from evalbot.model import (
    Artifact,
    Comment,
    MergeResult,
    PullRequest,
    WorkflowRun,
)

DEFAULT_BASE_URL = "https://api.github.com"


PER_PAGE = 100


STATUS_DESCRIPTION_MAX = 140  # GitHub answers 422 to a longer commit-status description


MERGE_METHODS = ("merge", "squash", "rebase")


MAX_ARTIFACT_BYTES = 512 * 1024 * 1024


# A patch fetcher gets (base_sha, head_sha, path) and returns the file's unified diff, or None.
PatchFetcher = Callable[[str, str, str], "str | None"]


class GitHubError(Exception):
    """GitHub refused a request: the request, the HTTP status and GitHub's own message."""

    def __init__(self, request: str, status: int | None, message: str):
        shown = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"{request}: {shown}: {message}")
        self.request, self.status, self.message = request, status, message


class GitHubUnavailable(GitHubError):
    """GitHub stayed down, slow or rate limited past the retry budget: an infrastructure fault."""


class ArtifactRejected(Exception):
    """A downloaded artifact that is no zip, is too large, or would write outside its folder."""


class GitHubPort(Protocol):
    """Everything the bot asks of GitHub for one repository, in plain data."""

    def list_open_pulls(self, force: bool = False) -> tuple[PullRequest, ...] | None:
        """Open PRs without files or commits; None when nothing changed since the last call (ETag)."""

    def get_pull(self, number: int) -> PullRequest:
        """All facts about one PR: files with patches, commits with their authors and committers."""

    def list_comments(self, number: int) -> tuple[Comment, ...]:
        """The PR's issue comments, oldest first."""

    def create_comment(self, number: int, body: str) -> Comment:
        """Post a new comment on the PR (never retried blindly: it may already have been posted)."""

    def edit_comment(self, comment_id: int, body: str) -> Comment:
        """Replace the body of an existing comment."""

    def add_labels(self, number: int, labels: Sequence[str]) -> tuple[str, ...]:
        """Add labels; returns the PR's labels afterwards."""

    def remove_label(self, number: int, label: str) -> None:
        """Remove one label; a label already absent is not an error."""

    def close(self, number: int) -> None:
        """Close the PR without merging."""

    def reopen(self, number: int) -> None:
        """Reopen a closed, unmerged PR."""

    def merge(
        self,
        number: int,
        sha: str,
        method: str = "squash",
        title: str | None = None,
        message: str | None = None,
    ) -> MergeResult:
        """Merge only if the head is still ``sha``; a moved head or an unmergeable PR is a result, not an error."""

    def create_status(
        self, sha: str, state: str, context: str, description: str = "", target_url: str | None = None
    ) -> None:
        """Set a commit status (error, failure, pending, success) on ``sha``."""

    def dispatch_workflow(self, workflow_file: str, ref: str, inputs: Mapping[str, str]) -> int | None:
        """Start a workflow_dispatch run; returns its run id when GitHub reports it."""

    def list_workflow_runs(
        self,
        workflow_file: str | None = None,
        head_sha: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> tuple[WorkflowRun, ...]:
        """Runs of one workflow (or all), newest first, optionally for one head sha or status."""

    def get_workflow_run(self, run_id: int) -> WorkflowRun:
        """One run, fresh."""

    def list_run_artifacts(self, run_id: int) -> tuple[Artifact, ...]:
        """The artifacts a run uploaded."""

    def list_run_jobs(self, run_id: int) -> tuple[dict[str, Any], ...]:
        """A run's jobs: id, name, status, conclusion, runner_name."""
        ...

    def cancel_workflow_run(self, run_id: int) -> None:
        """Cancel a run."""
        ...

    def download_artifact(self, artifact_id: int, dest_dir: Path) -> Path:
        """Download an artifact's zip and unpack it safely under ``dest_dir``; returns the folder."""


__all__ = [
    "DEFAULT_BASE_URL",
    "MAX_ARTIFACT_BYTES",
    "MERGE_METHODS",
    "PER_PAGE",
    "STATUS_DESCRIPTION_MAX",
    "ArtifactRejected",
    "GitHubError",
    "GitHubPort",
    "GitHubUnavailable",
    "PatchFetcher",
]
