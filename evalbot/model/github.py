"""GitHub's facts as the bot keeps them: intake turns PyGithub objects into these, and nothing downstream
sees PyGithub. Plain frozen data, like the rest of ``evalbot.model``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

# --- GitHub facts (intake turns PyGithub objects into these; nothing downstream sees PyGithub) ----


@dataclass(frozen=True)
class Commit:
    """One commit of a PR: who wrote it and who committed it (GitHub logins when known, else git names)."""

    sha: str
    author: str | None  # GitHub login of the author; None when the email maps to no account
    committer: str | None
    author_name: str = ""  # git's recorded names, for blocklists keyed on them
    committer_name: str = ""
    # `Co-authored-by:` trailers: the GitHub login when the email is a users.noreply one, else the name
    co_authors: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileChange:
    """One changed file of a PR, with its unified-diff patch (empty for binary or huge files)."""

    path: str
    status: str  # added, removed, modified, renamed, copied, changed, unchanged
    additions: int
    deletions: int
    patch: str = ""
    previous_path: str | None = None  # for renames


@dataclass(frozen=True)
class PullRequest:
    """The facts about one PR that policy, copycat, evaluate and publish need."""

    number: int
    author: str
    title: str
    body: str
    state: str  # open or closed
    draft: bool
    merged: bool
    head_sha: str
    base_sha: str
    base_ref: str
    head_ref: str
    created_at: str  # ISO 8601 UTC, e.g. 2026-11-30T10:00:00Z
    updated_at: str
    labels: tuple[str, ...] = ()
    files: tuple[FileChange, ...] = ()
    commits: tuple[Commit, ...] = ()
    author_association: str = "NONE"  # OWNER, MEMBER, COLLABORATOR, CONTRIBUTOR, NONE, ...
    closed_at: str | None = None
    merged_at: str | None = None
    # Why these facts may be partial: GitHub lists at most 3000 files and 250 commits of a PR, and omits
    # the patch of huge files. Empty when the facts are complete; a policy must not vouch for a PR otherwise.
    incomplete: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the PR touches, including the old side of renames."""
        out = []
        for f in self.files:
            out.append(f.path)
            if f.previous_path:
                out.append(f.previous_path)
        return tuple(out)


@dataclass(frozen=True)
class Comment:
    """An issue comment on a PR."""

    id: int
    author: str
    body: str
    created_at: str = ""
    updated_at: str = ""


class MergeOutcome(enum.StrEnum):
    """What a merge attempt made of the PR."""

    MERGED = "merged"
    HEAD_MOVED = "head_moved"  # 409: the head is no longer the sha that was measured; nothing merged
    NOT_MERGEABLE = "not_mergeable"  # 405: conflicts, branch protection, already merged; nothing merged


@dataclass(frozen=True)
class MergeResult:
    """The answer to a merge with ``sha=``; ``sha`` here is the merge commit when merged."""

    outcome: MergeOutcome
    message: str
    sha: str | None = None


@dataclass(frozen=True)
class WorkflowRun:
    """One GitHub Actions run, as the runner pool tracks it."""

    id: int
    name: str
    workflow_id: int
    head_sha: str
    head_branch: str
    event: str
    status: str  # queued, in_progress, completed, ...
    conclusion: str | None  # success, failure, cancelled, ... once completed
    display_title: str = ""
    html_url: str = ""
    created_at: str = ""
    updated_at: str = ""
    run_attempt: int = 1


@dataclass(frozen=True, kw_only=True)
class RunPlacement:
    """Where an evaluation was dispatched (workflow and ref), when, until when it must be done, and the run
    it became once found: what a dispatch handle and the store's row of it share."""

    workflow: str
    ref: str
    dispatched_at: datetime
    deadline: datetime
    run_id: int | None = None
    runner_name: str | None = None
    html_url: str = ""

    def placement(self) -> dict[str, Any]:
        """These fields by name, to make a handle into a row and back."""
        return {f.name: getattr(self, f.name) for f in fields(RunPlacement)}


@dataclass(frozen=True)
class Artifact:
    """One artifact uploaded by a workflow run."""

    id: int
    name: str
    size_in_bytes: int
    expired: bool
    run_id: int | None = None
