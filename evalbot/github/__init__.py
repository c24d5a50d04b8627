"""GitHub for the bot: the GitHubPort protocol that the rest of evalbot programs against, and its adapter.

This package is the only one that imports PyGithub (``adapter`` alone does); ``port`` is the protocol
and its errors, ``facts`` turns GitHub's JSON into plain dataclasses. Everything crossing its boundary is a plain dataclass. Every
request goes through one loop that waits out rate limits and retries server faults, so an outage surfaces
as GitHubUnavailable (an infrastructure fault) and a refusal as GitHubError.
"""

from __future__ import annotations

from evalbot.github.adapter import PyGithubAdapter, extract_zip_safely, next_link
from evalbot.github.facts import (
    artifact_from_json,
    co_authors,
    comment_from_json,
    commit_from_json,
    file_from_json,
    pull_from_json,
    run_from_json,
)
from evalbot.github.port import (
    DEFAULT_BASE_URL,
    MAX_ARTIFACT_BYTES,
    MERGE_METHODS,
    PER_PAGE,
    STATUS_DESCRIPTION_MAX,
    ArtifactRejected,
    GitHubError,
    GitHubPort,
    GitHubUnavailable,
    PatchFetcher,
)

__all__ = [
    "ArtifactRejected",
    "DEFAULT_BASE_URL",
    "GitHubError",
    "GitHubPort",
    "GitHubUnavailable",
    "MAX_ARTIFACT_BYTES",
    "MERGE_METHODS",
    "PER_PAGE",
    "PatchFetcher",
    "PyGithubAdapter",
    "STATUS_DESCRIPTION_MAX",
    "artifact_from_json",
    "co_authors",
    "comment_from_json",
    "commit_from_json",
    "extract_zip_safely",
    "file_from_json",
    "next_link",
    "pull_from_json",
    "run_from_json",
]
