"""The PyGithub adapter of the GitHubPort: every request through one loop that waits out rate limits and
retries server faults, so an outage surfaces as GitHubUnavailable and a refusal as GitHubError."""

from __future__ import annotations

import json
import random
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests
from github import Auth, Github, GithubException
from github.Requester import Requester

from evalbot.github.artifacts import extract_zip_safely
from evalbot.github.facts import (
    artifact_from_json,
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
    GitHubUnavailable,
    PatchFetcher,
)
from evalbot.github_retry import RetryPolicy, next_step
from evalbot.model import (
    Artifact,
    Comment,
    FileChange,
    MergeOutcome,
    MergeResult,
    PullRequest,
    WorkflowRun,
)


@dataclass(frozen=True)
class _Reply:
    status: int
    headers: dict[str, str]  # names lower-cased
    data: Any


class PyGithubAdapter:
    """GitHubPort over PyGithub's requester: conditional polling, rate-limit waits, bounded retries."""

    def __init__(
        self,
        repo: str,
        gh: Github,
        *,
        timeout: float | None = None,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        git_patch_fetcher: PatchFetcher | None = None,
    ):
        owner, _, name = repo.partition("/")
        if not owner or not name or "/" in name:
            raise ValueError(f"repo must be 'owner/name', got {repo!r}")
        self._repo = f"/repos/{urllib.parse.quote(owner)}/{urllib.parse.quote(name)}"
        kwargs = dict(gh.requester.kwargs)
        # PyGithub's default urllib3 retry sleeps on its own on 403s and 5xx; ours must be the only loop.
        kwargs["retry"] = None
        if timeout is not None:
            kwargs["timeout"] = timeout
        self._requester = Requester(**kwargs)
        self._timeout = kwargs["timeout"]
        self._session = requests.Session()  # for artifact blobs, which live on another host
        self._policy = policy or RetryPolicy()
        self._sleep, self._clock = sleep, clock
        self._rng = rng or random.Random()
        self._git_patch_fetcher = git_patch_fetcher
        self._pulls_etag: str | None = None

    @classmethod
    def from_token(
        cls, repo: str, token: str, *, base_url: str = DEFAULT_BASE_URL, pace: bool = True, **options: Any
    ) -> PyGithubAdapter:
        """An adapter authenticated by a token; ``pace`` keeps PyGithub's default spacing of requests."""
        return cls(repo, _github(Auth.Token(token), base_url, pace), **options)

    # --- pulls ---

    def list_open_pulls(self, force: bool = False) -> tuple[PullRequest, ...] | None:
        """Open PRs without files or commits; None when nothing changed since the last call (ETag).

        ``force`` reads in full whatever the ETag says.
        """
        # Sorted by last update, any change to an open PR lands on page one and changes its ETag. Only a PR
        # closed while on a later page goes unseen; an occasional forced read catches that.
        params = {"state": "open", "sort": "updated", "direction": "desc", "per_page": PER_PAGE}
        headers = {"If-None-Match": self._pulls_etag} if self._pulls_etag and not force else {}
        first = self._send("GET", f"{self._repo}/pulls", params=params, headers=headers)
        if first.status == 304:
            return None
        pulls = tuple(pull_from_json(item) for item in self._follow(first))
        # Stored only now: a poll that failed half way must not be answered "unchanged" next time.
        self._pulls_etag = first.headers.get("etag")
        return pulls

    def get_pull(self, number: int) -> PullRequest:
        """All facts about one PR: files with patches, commits with their authors and committers."""
        for _ in range(3):
            raw = self._send("GET", f"{self._repo}/pulls/{number}").data
            pull = pull_from_json(raw)
            files = tuple(file_from_json(f) for f in self._pages(f"{self._repo}/pulls/{number}/files"))
            commits = tuple(commit_from_json(c) for c in self._pages(f"{self._repo}/pulls/{number}/commits"))
            complete_commits = len(commits) == raw.get("commits", len(commits))
            if complete_commits and commits and commits[-1].sha != pull.head_sha:
                continue  # a push landed between our reads: these files may belong to another head
            files, missing = self._fill_patches(pull, files)
            incomplete = (
                [f"GitHub omitted the patch of {len(missing)} file(s): {', '.join(missing[:5])}"]
                if missing
                else []
            )
            listed = raw.get("changed_files", len(files))
            if len(files) < listed:
                incomplete.append(f"GitHub listed {len(files)} of the PR's {listed} changed files")
            if not complete_commits:
                incomplete.append(f"GitHub listed {len(commits)} of the PR's {raw['commits']} commits")
            return replace(pull, files=files, commits=commits, incomplete=tuple(incomplete))
        raise GitHubUnavailable(
            f"GET {self._repo}/pulls/{number}", None, "the head kept moving while it was read"
        )

    def _fill_patches(
        self, pull: PullRequest, files: tuple[FileChange, ...]
    ) -> tuple[tuple[FileChange, ...], list[str]]:
        out, missing = [], []
        for f in files:
            # No patch with changed lines means GitHub cut it for size (binary files report no lines).
            if not f.patch and f.additions + f.deletions > 0:
                fetch = self._git_patch_fetcher
                patch = fetch(pull.base_sha, pull.head_sha, f.path) if fetch else None
                f = replace(f, patch=patch) if patch else f
                missing += [] if patch else [f.path]
            out.append(f)
        return tuple(out), missing

    def merge(
        self,
        number: int,
        sha: str,
        method: str = "squash",
        title: str | None = None,
        message: str | None = None,
    ) -> MergeResult:
        """Merge only if the head is still ``sha``; a moved head or an unmergeable PR is a result, not an error."""
        if method not in MERGE_METHODS:
            raise ValueError(f"merge method must be one of {MERGE_METHODS}, got {method!r}")
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise ValueError(f"merge needs the full 40-hex head sha that was measured, got {sha!r}")
        body: dict[str, str] = {"sha": sha, "merge_method": method}
        if title is not None:
            body["commit_title"] = title
        if message is not None:
            body["commit_message"] = message
        try:
            # Not retried blindly: a merge that timed out may have happened, and a retry would then say 405.
            reply = self._send("PUT", f"{self._repo}/pulls/{number}/merge", body=body, idempotent=False)
        except GitHubError as exc:
            if exc.status == 409:
                return MergeResult(MergeOutcome.HEAD_MOVED, exc.message)
            if exc.status == 405:
                return MergeResult(MergeOutcome.NOT_MERGEABLE, exc.message)
            raise
        data = reply.data or {}
        if not data.get("merged"):
            return MergeResult(MergeOutcome.NOT_MERGEABLE, data.get("message", "GitHub did not merge"))
        return MergeResult(MergeOutcome.MERGED, data.get("message", ""), data.get("sha"))

    # --- comments, labels, state, statuses ---

    def list_comments(self, number: int) -> tuple[Comment, ...]:
        """The PR's issue comments, oldest first."""
        return tuple(comment_from_json(c) for c in self._pages(f"{self._repo}/issues/{number}/comments"))

    def create_comment(self, number: int, body: str) -> Comment:
        """Post a new comment on the PR (never retried blindly: it may already have been posted)."""
        reply = self._send(
            "POST", f"{self._repo}/issues/{number}/comments", body={"body": body}, idempotent=False
        )
        return comment_from_json(reply.data)

    def edit_comment(self, comment_id: int, body: str) -> Comment:
        """Replace the body of an existing comment."""
        return comment_from_json(
            self._send("PATCH", f"{self._repo}/issues/comments/{comment_id}", body={"body": body}).data
        )

    def add_labels(self, number: int, labels: Sequence[str]) -> tuple[str, ...]:
        """Add labels; returns the PR's labels afterwards."""
        reply = self._send("POST", f"{self._repo}/issues/{number}/labels", body={"labels": list(labels)})
        return tuple(label["name"] for label in reply.data)

    def remove_label(self, number: int, label: str) -> None:
        """Remove one label; a label already absent is not an error."""
        try:
            self._send("DELETE", f"{self._repo}/issues/{number}/labels/{urllib.parse.quote(label, safe='')}")
        except GitHubError as exc:
            if exc.status != 404:
                raise

    def close(self, number: int) -> None:
        """Close the PR without merging."""
        self._send("PATCH", f"{self._repo}/issues/{number}", body={"state": "closed"})

    def reopen(self, number: int) -> None:
        """Reopen a closed, unmerged PR."""
        self._send("PATCH", f"{self._repo}/issues/{number}", body={"state": "open"})

    def authenticated_login(self) -> str | None:
        """The login the token acts as (a user's token); None for tokens that have no user (an app's).

        Only a refusal (401, 403, 404) means "no user": an outage raises, so a 502 never makes the bot
        take another login and miss its own comments.
        """
        try:
            login = self._send("GET", "/user").data.get("login")
        except GitHubUnavailable:  # down or rate limited (which GitHub may also answer with a 403)
            raise
        except GitHubError as exc:
            if exc.status in (401, 403, 404):
                return None
            raise
        return login if isinstance(login, str) and login else None

    def create_status(
        self, sha: str, state: str, context: str, description: str = "", target_url: str | None = None
    ) -> None:
        """Set a commit status (error, failure, pending, success) on ``sha``."""
        if state not in ("error", "failure", "pending", "success"):
            raise ValueError(f"commit status state must be error, failure, pending or success, got {state!r}")
        if len(description) > STATUS_DESCRIPTION_MAX:
            description = description[: STATUS_DESCRIPTION_MAX - 1] + "…"
        body = {"state": state, "context": context, "description": description}
        if target_url:
            body["target_url"] = target_url
        self._send("POST", f"{self._repo}/statuses/{sha}", body=body)

    # --- actions ---

    def dispatch_workflow(self, workflow_file: str, ref: str, inputs: Mapping[str, str]) -> int | None:
        """Start a workflow_dispatch run; returns its run id when GitHub reports it."""
        body = {"ref": ref, "inputs": dict(inputs), "return_run_details": True}
        url = f"{self._repo}/actions/workflows/{urllib.parse.quote(workflow_file, safe='')}/dispatches"
        # Not retried blindly: a second dispatch would occupy a second runner with the same job.
        reply = self._send("POST", url, body=body, idempotent=False)
        return (reply.data or {}).get("workflow_run_id") if reply.status == 200 else None

    def list_workflow_runs(
        self,
        workflow_file: str | None = None,
        head_sha: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> tuple[WorkflowRun, ...]:
        """Runs of one workflow (or all), newest first, optionally for one head sha or status."""
        url = f"{self._repo}/actions/runs"
        if workflow_file is not None:
            url = f"{self._repo}/actions/workflows/{urllib.parse.quote(workflow_file, safe='')}/runs"
        params = {k: v for k, v in (("head_sha", head_sha), ("status", status)) if v is not None}
        return tuple(run_from_json(r) for r in self._pages(url, params, key="workflow_runs", limit=limit))

    def get_workflow_run(self, run_id: int) -> WorkflowRun:
        """One run, fresh."""
        return run_from_json(self._send("GET", f"{self._repo}/actions/runs/{run_id}").data)

    def list_run_artifacts(self, run_id: int) -> tuple[Artifact, ...]:
        """The artifacts a run uploaded."""
        items = self._pages(f"{self._repo}/actions/runs/{run_id}/artifacts", key="artifacts")
        return tuple(artifact_from_json(a) for a in items)

    def list_run_jobs(self, run_id: int) -> tuple[dict[str, Any], ...]:
        """A run's jobs as {id, name, status, conclusion, runner_name} (which box took the run)."""
        items = self._pages(f"{self._repo}/actions/runs/{run_id}/jobs", key="jobs")
        keys = ("id", "name", "status", "conclusion", "runner_name")
        return tuple({k: j.get(k) for k in keys} for j in items)

    def cancel_workflow_run(self, run_id: int) -> None:
        """Ask GitHub to cancel a run (a timed-out evaluation must not keep its runner busy)."""
        self._send("POST", f"{self._repo}/actions/runs/{run_id}/cancel")

    def download_artifact(
        self, artifact_id: int, dest_dir: Path, max_bytes: int = MAX_ARTIFACT_BYTES
    ) -> Path:
        """Download an artifact's zip and unpack it safely under ``dest_dir``; returns the folder."""
        url = f"{self._repo}/actions/artifacts/{artifact_id}/zip"
        redirect = self._send("GET", url)
        location = redirect.headers.get("location")
        if redirect.status != 302 or not location:
            raise GitHubError(f"GET {url}", redirect.status, "expected a redirect to the archive")
        # The location is a short-lived signed URL on a storage host: our token must not travel there.
        blob = self._retrying(
            f"GET artifact {artifact_id} archive", lambda: self._fetch_blob(location, max_bytes), True
        )
        return extract_zip_safely(blob.data, Path(dest_dir) / f"artifact-{artifact_id}", max_bytes)

    # --- transport ---

    def _pages(
        self,
        url: str,
        params: Mapping[str, str] | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[Any]:
        first = self._send("GET", url, params={**(params or {}), "per_page": str(PER_PAGE)})
        return self._follow(first, key, limit)

    def _follow(self, reply: _Reply, key: str | None = None, limit: int | None = None) -> list[Any]:
        items: list[Any] = []
        while True:
            items.extend(reply.data[key] if key else reply.data)
            nxt = next_link(reply.headers.get("link", ""))
            if nxt is None or (limit is not None and len(items) >= limit):
                return items[:limit] if limit is not None else items
            reply = self._send("GET", nxt)

    def _send(
        self,
        verb: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> _Reply:
        def attempt() -> _Reply:
            # PyGithub adds auth and user agent to the dict it is given, so each try gets a fresh one.
            status, got, text = self._requester.requestJson(
                verb, url, dict(params or {}), dict(headers or {}), body
            )
            return _Reply(status, _lower(got), _parse(text))

        return self._retrying(f"{verb} {url.split('?')[0]}", attempt, idempotent)

    def _fetch_blob(self, location: str, max_bytes: int) -> _Reply:
        with self._session.get(location, timeout=self._timeout, stream=True, allow_redirects=True) as r:
            chunks, size = [], 0
            for chunk in r.iter_content(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    raise ArtifactRejected(f"artifact archive is larger than {max_bytes} bytes")
                chunks.append(chunk)
            data = b"".join(chunks)
            return _Reply(r.status_code, _lower(r.headers), data if r.ok else _parse(data))

    def _retrying(self, request: str, attempt: Callable[[], _Reply], idempotent: bool) -> _Reply:
        rate_waited, faults = 0.0, 0
        while True:
            status: int | None
            try:
                reply = attempt()
                if reply.status < 400:
                    return reply
                status, headers, message = reply.status, reply.headers, _message(reply.data)
            except GithubException as exc:  # from PyGithub's own calls, e.g. minting an App token
                status, headers, message = exc.status, _lower(exc.headers or {}), _message(exc.data)
            except requests.RequestException as exc:  # timeouts, refused and dropped connections
                status, headers, message = None, {}, f"{type(exc).__name__}: {exc}"
            step = next_step(
                status,
                headers,
                message,
                now=self._clock(),
                idempotent=idempotent,
                faults=faults,
                rate_waited=rate_waited,
                policy=self._policy,
                rng=self._rng,
            )
            if step.wait is None:
                raise (GitHubUnavailable if step.infra else GitHubError)(request, status, step.reason)
            self._sleep(step.wait)
            if step.rate_limited:
                rate_waited += step.wait
            else:
                faults += 1


def _github(auth: Auth.Auth, base_url: str, pace: bool) -> Github:
    spacing: dict[str, Any] = (
        {} if pace else {"seconds_between_requests": None, "seconds_between_writes": None}
    )
    return Github(auth=auth, base_url=base_url, retry=None, user_agent="evalbot (PyGithub)", **spacing)


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _parse(raw: str | bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"message": (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)[:300]}


def _message(data: Any) -> str:
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return "no message"


def next_link(header: str) -> str | None:
    """The rel="next" URL of a Link header, or None on the last page."""
    for part in header.split(","):
        match = re.match(r"\s*<([^>]*)>\s*;(.*)", part)
        if match and re.search(r'\brel="?next"?', match.group(2)):
            return match.group(1)
    return None


__all__ = ["PyGithubAdapter", "next_link"]
