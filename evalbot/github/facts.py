"""GitHub JSON -> the plain facts of evalbot.model (pull requests, files, commits, comments, runs,
artifacts). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from evalbot.model import (
    Artifact,
    Comment,
    Commit,
    FileChange,
    PullRequest,
    WorkflowRun,
)


def _login(user: Mapping[str, Any] | None) -> str | None:
    return user.get("login") if user else None


def pull_from_json(data: Mapping[str, Any]) -> PullRequest:
    """A PR object (from the list or from GET pulls/{n}) as facts, without files and commits."""
    merged_at = data.get("merged_at")
    return PullRequest(
        number=data["number"],
        author=_login(data.get("user")) or "ghost",  # GitHub's name for a deleted account
        title=data["title"],
        body=data.get("body") or "",
        state=data["state"],
        draft=bool(data.get("draft", False)),
        merged=bool(data.get("merged", merged_at is not None)),
        head_sha=data["head"]["sha"],
        base_sha=data["base"]["sha"],
        base_ref=data["base"]["ref"],
        head_ref=data["head"]["ref"],
        created_at=data["created_at"],
        updated_at=data["updated_at"],
        labels=tuple(label["name"] for label in data.get("labels", ())),
        author_association=data.get("author_association", "NONE"),
        closed_at=data.get("closed_at"),
        merged_at=merged_at,
    )


def file_from_json(data: Mapping[str, Any]) -> FileChange:
    """One entry of pulls/{n}/files; ``patch`` is absent for binary and huge files."""
    return FileChange(
        path=data["filename"],
        status=data["status"],
        additions=data["additions"],
        deletions=data["deletions"],
        patch=data.get("patch") or "",
        previous_path=data.get("previous_filename"),
    )


_NOREPLY = re.compile(r"(?:\d+\+)?([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))@users\.noreply\.github\.com")


def co_authors(message: str) -> tuple[str, ...]:
    """Who a commit message's `Co-authored-by: Name <email>` trailers name: the login of a GitHub
    noreply email, else the name. Read line by line with string operations (linear in the message)."""
    out: list[str] = []
    for line in message.splitlines():
        if line[:15].lower() != "co-authored-by:":
            continue
        name, _, rest = line[15:].partition("<")
        email = rest.split(">", 1)[0].strip()
        m = _NOREPLY.fullmatch(email)
        who = m.group(1) if m else name.strip()
        if who and who not in out:
            out.append(who[:100])
    return tuple(out[:50])


def commit_from_json(data: Mapping[str, Any]) -> Commit:
    """One entry of pulls/{n}/commits: GitHub accounts when the emails map to one, git's names, and the
    co-authors its message names."""
    git = data["commit"]
    return Commit(
        sha=data["sha"],
        author=_login(data.get("author")),
        committer=_login(data.get("committer")),
        author_name=(git.get("author") or {}).get("name", ""),
        committer_name=(git.get("committer") or {}).get("name", ""),
        co_authors=co_authors(str(git.get("message") or "")),
    )


def comment_from_json(data: Mapping[str, Any]) -> Comment:
    """An issue comment."""
    return Comment(
        id=data["id"],
        author=_login(data.get("user")) or "ghost",
        body=data.get("body") or "",
        created_at=data.get("created_at", ""),
        updated_at=data.get("updated_at", ""),
    )


def run_from_json(data: Mapping[str, Any]) -> WorkflowRun:
    """A workflow run object."""
    return WorkflowRun(
        id=data["id"],
        name=data.get("name") or "",
        workflow_id=data["workflow_id"],
        head_sha=data["head_sha"],
        head_branch=data.get("head_branch") or "",
        event=data["event"],
        status=data["status"],
        conclusion=data.get("conclusion"),
        display_title=data.get("display_title") or "",
        html_url=data.get("html_url", ""),
        created_at=data.get("created_at", ""),
        updated_at=data.get("updated_at", ""),
        run_attempt=data.get("run_attempt", 1),
    )


def artifact_from_json(data: Mapping[str, Any]) -> Artifact:
    """An artifact object."""
    run = data.get("workflow_run") or {}
    return Artifact(
        id=data["id"],
        name=data["name"],
        size_in_bytes=data["size_in_bytes"],
        expired=data["expired"],
        run_id=run.get("id"),
    )


__all__ = [
    "artifact_from_json",
    "co_authors",
    "comment_from_json",
    "commit_from_json",
    "file_from_json",
    "pull_from_json",
    "run_from_json",
]
