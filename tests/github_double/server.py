"""The GitHub test double's HTTP side: the REST subset the bot uses, served from a GitHubState.

Answers carry GitHub's headers (rate limit, ETag, Link pagination), conditional GETs answer 304 without
spending the rate limit, and queued faults turn the next request of a route into a 5xx, a hang, a dropped
connection or a rate-limit refusal.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.github_double import shapes
from tests.github_double.state import (
    SECONDARY_LIMIT_MESSAGE,
    CommentState,
    Fault,
    GitHubState,
    RecordedRequest,
    StatusState,
    fake_sha,
)


@dataclass
class Answer:
    status: int
    body: Any = None  # JSON data, raw bytes, or None for no body
    headers: dict[str, str] = field(default_factory=dict)


class Refusal(Exception):
    """An error answer raised from inside a route."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


Request = tuple[dict[str, str], dict[str, str], Any]  # path groups, query, JSON body
Route = Callable[[GitHubState, Request], Answer]
REPO = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"
ROUTES: list[tuple[str, str, re.Pattern[str], Route]] = []


def route(name: str, method: str, pattern: str) -> Callable[[Route], Route]:
    """Register a route under a name that faults and the request log use."""

    def register(fn: Route) -> Route:
        ROUTES.append((name, method, re.compile(pattern + r"/?"), fn))
        return fn

    return register


def _pull(s: GitHubState, groups: dict[str, str]):
    number = int(groups["number"])
    if number not in s.pulls:
        raise Refusal(404, "Not Found")
    return s.pulls[number]


def _page(s: GitHubState, items: list[Any], query: dict[str, str], path: str) -> Answer:
    per_page = max(1, min(int(query.get("per_page", 30)), 100))
    page = max(1, int(query.get("page", 1)))
    last = max(1, math.ceil(len(items) / per_page))

    def link(n: int) -> str:
        return f"{s.base_url}{path}?{urllib.parse.urlencode({**query, 'page': n, 'per_page': per_page})}"

    rels = []
    if page < last:
        rels += [f'<{link(page + 1)}>; rel="next"', f'<{link(last)}>; rel="last"']
    if page > 1:
        rels += [f'<{link(page - 1)}>; rel="prev"', f'<{link(1)}>; rel="first"']
    answer = Answer(200, items[(page - 1) * per_page : page * per_page])
    if rels:
        answer.headers["Link"] = ", ".join(rels)
    return answer


def _wrapped(s: GitHubState, key: str, items: list[Any], query: dict[str, str], path: str) -> Answer:
    answer = _page(s, items, query, path)
    answer.body = {"total_count": len(items), key: answer.body}
    return answer


# --- repository, user, limits, app ---


@route("repos.get", "GET", REPO)
def _repo(s: GitHubState, r: Request) -> Answer:
    return Answer(200, shapes.repo(s))


@route("user.get", "GET", "/user")
def _user(s: GitHubState, r: Request) -> Answer:
    return Answer(200, shapes.authenticated_user(s))


@route("rate_limit.get", "GET", "/rate_limit")
def _rate_limit(s: GitHubState, r: Request) -> Answer:
    return Answer(200, shapes.rate_limit(s, s.now + 3600))


@route("app.token", "POST", r"/app/installations/(?P<installation>\d+)/access_tokens")
def _app_token(s: GitHubState, r: Request) -> Answer:
    expires = time.time() + 3600  # PyGithub compares it with the real clock
    token = {
        "token": f"ghs_double{r[0]['installation']}",
        "expires_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
        "permissions": {"contents": "read", "issues": "write", "pull_requests": "write", "actions": "write"},
        "repository_selection": "selected",
    }
    return Answer(201, token)


# --- pulls ---


@route("pulls.list", "GET", REPO + "/pulls")
def _pulls(s: GitHubState, r: Request) -> Answer:
    _, query, _ = r
    want = query.get("state", "open")
    pulls = [p for p in s.pulls.values() if want == "all" or p.state == want]
    key = "updated_at" if query.get("sort") == "updated" else "created_at"
    default = "desc" if key == "created_at" else "asc"
    newest_first = query.get("direction", default) == "desc"
    pulls.sort(key=lambda p: (getattr(p, key), p.number), reverse=newest_first)
    return _page(s, [shapes.pull(s, p, full=False) for p in pulls], query, f"/repos/{s.owner}/{s.name}/pulls")


@route("pulls.get", "GET", REPO + r"/pulls/(?P<number>\d+)")
def _pull_get(s: GitHubState, r: Request) -> Answer:
    p = _pull(s, r[0])
    body = shapes.pull(s, p, full=True)
    p.mergeable_null_polls = max(0, p.mergeable_null_polls - 1)
    return Answer(200, body)


@route("pulls.files", "GET", REPO + r"/pulls/(?P<number>\d+)/files")
def _pull_files(s: GitHubState, r: Request) -> Answer:
    p = _pull(s, r[0])
    files = [shapes.pull_file(s, p, f) for f in p.files[: s.files_cap]]
    return _page(s, files, r[1], f"/repos/{s.owner}/{s.name}/pulls/{p.number}/files")


@route("pulls.commits", "GET", REPO + r"/pulls/(?P<number>\d+)/commits")
def _pull_commits(s: GitHubState, r: Request) -> Answer:
    p = _pull(s, r[0])
    commits = [shapes.commit(s, c) for c in p.commits[: s.commits_cap]]
    return _page(s, commits, r[1], f"/repos/{s.owner}/{s.name}/pulls/{p.number}/commits")


@route("pulls.merge", "PUT", REPO + r"/pulls/(?P<number>\d+)/merge")
def _merge(s: GitHubState, r: Request) -> Answer:
    p, body = _pull(s, r[0]), r[2] or {}
    method = body.get("merge_method", "merge")
    if method not in ("merge", "squash", "rebase"):
        raise Refusal(422, f"Invalid merge_method: {method}")
    if p.merged or p.state != "open":
        raise Refusal(405, "Pull Request is not mergeable")
    if method not in s.allowed_merge_methods:
        raise Refusal(405, f"{method.capitalize()} merges are not allowed on this repository.")
    if body.get("sha") and body["sha"] != p.head_sha:
        raise Refusal(409, "Head branch was modified. Review and try the merge again.")
    if p.mergeable is False:
        raise Refusal(405, "Pull Request is not mergeable")
    title = body.get("commit_title") or f"{p.title} (#{p.number})"
    message = body.get("commit_message", "")
    try:
        sha = p.merger(p, method, title, message) if p.merger else fake_sha("merge", p.number, p.head_sha)
    except ValueError as exc:  # the real merge found conflicts
        raise Refusal(405, f"Pull Request is not mergeable: {exc}") from exc
    now = s.tick()
    p.merged, p.state, p.merge_commit_sha, p.merged_by = True, "closed", sha, s.bot
    p.merged_at = p.closed_at = p.updated_at = now
    s.refs[p.base_ref] = sha
    return Answer(200, {"sha": sha, "merged": True, "message": "Pull Request successfully merged"})


# --- issues: state, comments, labels ---


@route("issues.update", "PATCH", REPO + r"/issues/(?P<number>\d+)")
def _issue_update(s: GitHubState, r: Request) -> Answer:
    p, body = _pull(s, r[0]), r[2] or {}
    want = body.get("state", p.state)
    if want not in ("open", "closed"):
        raise Refusal(422, f"state must be open or closed, not {want!r}")
    if want == "open" and p.merged:
        raise Refusal(422, "A merged pull request cannot be reopened.")
    if want != p.state:
        p.state, p.updated_at = want, s.tick()
        p.closed_at = p.updated_at if want == "closed" else None
    return Answer(200, shapes.issue(s, p))


@route("comments.list", "GET", REPO + r"/issues/(?P<number>\d+)/comments")
def _comments(s: GitHubState, r: Request) -> Answer:
    p = _pull(s, r[0])
    comments = [shapes.comment(s, c) for c in s.comments_on(p.number)]
    return _page(s, comments, r[1], f"/repos/{s.owner}/{s.name}/issues/{p.number}/comments")


COMMENT_MAX_CHARS = 65536  # GitHub's limit on an issue comment's body


def _check_comment_body(body: Any) -> str:
    if not isinstance(body, dict) or not isinstance(body.get("body"), str) or not body["body"]:
        raise Refusal(422, "Invalid request: body is missing or empty.")
    if len(body["body"]) > COMMENT_MAX_CHARS:
        raise Refusal(422, f"Validation Failed: body is too long (maximum is {COMMENT_MAX_CHARS} characters)")
    return body["body"]


@route("comments.create", "POST", REPO + r"/issues/(?P<number>\d+)/comments")
def _comment_create(s: GitHubState, r: Request) -> Answer:
    p, body = _pull(s, r[0]), r[2] or {}
    _check_comment_body(body)
    now = s.tick()
    c = CommentState(s.new_id(), p.number, s.bot, body["body"], now, now)
    s.comments[c.id] = c
    return Answer(201, shapes.comment(s, c))


@route("comments.edit", "PATCH", REPO + r"/issues/comments/(?P<comment>\d+)")
def _comment_edit(s: GitHubState, r: Request) -> Answer:
    c, body = s.comments.get(int(r[0]["comment"])), r[2] or {}
    if c is None:
        raise Refusal(404, "Not Found")
    _check_comment_body(body)
    c.body, c.updated_at = body["body"], s.tick()
    return Answer(200, shapes.comment(s, c))


def _label_names(body: Any) -> list[str]:
    names = body.get("labels") if isinstance(body, dict) else body  # GitHub takes both shapes
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise Refusal(422, "Invalid request: labels must be a list of non-empty strings.")
    return names


@route("labels.add", "POST", REPO + r"/issues/(?P<number>\d+)/labels")
def _labels_add(s: GitHubState, r: Request) -> Answer:
    p = _pull(s, r[0])
    p.labels += [n for n in dict.fromkeys(_label_names(r[2])) if n not in p.labels]
    p.updated_at = s.tick()
    return Answer(200, [shapes.label(s, n) for n in p.labels])


@route("labels.set", "PUT", REPO + r"/issues/(?P<number>\d+)/labels")
def _labels_set(s: GitHubState, r: Request) -> Answer:
    p = _pull(s, r[0])
    p.labels, p.updated_at = list(dict.fromkeys(_label_names(r[2]))), s.tick()
    return Answer(200, [shapes.label(s, n) for n in p.labels])


@route("labels.remove", "DELETE", REPO + r"/issues/(?P<number>\d+)/labels/(?P<name>[^/]+)")
def _labels_remove(s: GitHubState, r: Request) -> Answer:
    p, name = _pull(s, r[0]), urllib.parse.unquote(r[0]["name"])
    if name not in p.labels:
        raise Refusal(404, "Label does not exist")
    p.labels.remove(name)
    p.updated_at = s.tick()
    return Answer(200, [shapes.label(s, n) for n in p.labels])


# --- commit statuses ---


@route("statuses.create", "POST", REPO + r"/statuses/(?P<sha>[^/]+)")
def _status_create(s: GitHubState, r: Request) -> Answer:
    sha, body = r[0]["sha"], r[2] or {}
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        raise Refusal(422, f"No commit found for SHA: {sha}")
    if body.get("state") not in ("error", "failure", "pending", "success"):
        raise Refusal(422, "Validation Failed: state must be error, failure, pending or success")
    if len(body.get("description") or "") > 140:
        raise Refusal(422, "Validation Failed: description is too long (maximum is 140 characters)")
    st = StatusState(
        s.new_id(), sha, body["state"], body.get("context", "default"), body.get("description"),
        body.get("target_url"), s.tick(), s.bot,
    )  # fmt: skip
    s.statuses.append(st)
    return Answer(201, shapes.status(s, st))


# --- actions ---


def _workflow(s: GitHubState, ident: str) -> str:
    for file, wid in s.workflows.items():
        if ident in (file, str(wid)):
            return file
    raise Refusal(404, "Not Found")


@route("workflows.dispatch", "POST", REPO + r"/actions/workflows/(?P<workflow>[^/]+)/dispatches")
def _dispatch(s: GitHubState, r: Request) -> Answer:
    file, body = _workflow(s, urllib.parse.unquote(r[0]["workflow"])), r[2] or {}
    ref = str(body.get("ref") or "").removeprefix("refs/heads/")
    if not ref:
        raise Refusal(422, "Invalid request: ref is required.")
    if ref not in s.refs:
        raise Refusal(422, f"No ref found for: {ref}")
    inputs = body.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise Refusal(422, "Invalid request: inputs must be an object.")
    run = s.start_run(file, ref, inputs)
    if not (body.get("return_run_details") and s.run_details_supported):
        return Answer(204)
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    html = f"https://github.com/{s.owner}/{s.name}/actions/runs/{run.id}"
    return Answer(
        200, {"workflow_run_id": run.id, "run_url": f"{api}/actions/runs/{run.id}", "html_url": html}
    )


def _runs(s: GitHubState, query: dict[str, str], path: str, file: str | None) -> Answer:
    runs = [
        run
        for run in sorted(s.runs.values(), key=lambda run: run.id, reverse=True)
        if (file is None or run.workflow_file == file)
        and query.get("head_sha", run.head_sha) == run.head_sha
        and query.get("branch", run.head_branch) == run.head_branch
        and query.get("event", run.event) == run.event
        and query.get("status") in (None, run.status, run.conclusion)
    ]
    return _wrapped(s, "workflow_runs", [shapes.run(s, run) for run in runs], query, path)


@route("workflows.runs", "GET", REPO + r"/actions/workflows/(?P<workflow>[^/]+)/runs")
def _workflow_runs(s: GitHubState, r: Request) -> Answer:
    file = _workflow(s, urllib.parse.unquote(r[0]["workflow"]))
    return _runs(s, r[1], f"/repos/{s.owner}/{s.name}/actions/workflows/{r[0]['workflow']}/runs", file)


@route("runs.list", "GET", REPO + r"/actions/runs")
def _all_runs(s: GitHubState, r: Request) -> Answer:
    return _runs(s, r[1], f"/repos/{s.owner}/{s.name}/actions/runs", None)


@route("runs.get", "GET", REPO + r"/actions/runs/(?P<run>\d+)")
def _run_get(s: GitHubState, r: Request) -> Answer:
    run = s.runs.get(int(r[0]["run"]))
    if run is None:
        raise Refusal(404, "Not Found")
    return Answer(200, shapes.run(s, run))


@route("runs.jobs", "GET", REPO + r"/actions/runs/(?P<run>\d+)/jobs")
def _run_jobs(s: GitHubState, r: Request) -> Answer:
    run = s.runs.get(int(r[0]["run"]))
    if run is None:
        raise Refusal(404, "Not Found")
    return _wrapped(
        s, "jobs", [shapes.job(s, run)], r[1], f"/repos/{s.owner}/{s.name}/actions/runs/{run.id}/jobs"
    )


@route("runs.cancel", "POST", REPO + r"/actions/runs/(?P<run>\d+)/cancel")
def _run_cancel(s: GitHubState, r: Request) -> Answer:
    run = s.runs.get(int(r[0]["run"]))
    if run is None:
        raise Refusal(404, "Not Found")
    if run.status == "completed":
        raise Refusal(409, "Cannot cancel a workflow run that is completed.")
    run.status, run.conclusion, run.updated_at = "completed", "cancelled", s.tick()
    return Answer(202, {})


@route("runs.artifacts", "GET", REPO + r"/actions/runs/(?P<run>\d+)/artifacts")
def _run_artifacts(s: GitHubState, r: Request) -> Answer:
    run_id = int(r[0]["run"])
    if run_id not in s.runs:
        raise Refusal(404, "Not Found")
    items = [shapes.artifact(s, a) for a in s.artifacts.values() if a.run_id == run_id]
    return _wrapped(s, "artifacts", items, r[1], f"/repos/{s.owner}/{s.name}/actions/runs/{run_id}/artifacts")


def _signature(artifact_id: int) -> str:
    return fake_sha("signed", artifact_id)


@route("artifacts.zip", "GET", REPO + r"/actions/artifacts/(?P<artifact>\d+)/zip")
def _artifact_zip(s: GitHubState, r: Request) -> Answer:
    a = s.artifacts.get(int(r[0]["artifact"]))
    if a is None:
        raise Refusal(404, "Not Found")
    if a.expired:
        raise Refusal(410, "Artifact has expired")
    # Like GitHub: a short-lived signed URL on the blob store, here a path of the same server.
    return Answer(302, None, {"Location": f"{s.base_url}/_blobs/artifacts/{a.id}.zip?sig={_signature(a.id)}"})


@route("blobs.get", "GET", r"/_blobs/artifacts/(?P<artifact>\d+)\.zip")
def _blob(s: GitHubState, r: Request) -> Answer:
    a = s.artifacts.get(int(r[0]["artifact"]))
    if a is None or r[1].get("sig") != _signature(a.id):
        raise Refusal(403, "Signature is not valid for this blob")
    return Answer(200, a.data, {"Content-Type": "application/zip"})


# --- the HTTP handler ---


def _etag(payload: bytes) -> str:
    return f'W/"{hashlib.sha256(payload).hexdigest()[:32]}"'


def make_handler(state: GitHubState) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``state``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in separate writes: with Nagle on, the client's delayed ACK held every
        # response back ~40 ms (a round of the restart test spent 3.6 of its 4.5 s waiting on it)
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the request log lives in state.requests

        def do_GET(self) -> None:
            self._serve()

        do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        def _serve(self) -> None:
            s = state
            parsed = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query))
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            name, fn, groups = "unknown", None, {}
            for route_name, method, pattern, handler in ROUTES:
                match = pattern.fullmatch(parsed.path)
                if match and method == self.command:
                    name, fn, groups = route_name, handler, match.groupdict()
                    break

            def record(status: int) -> None:
                with s.lock:
                    s.requests.append(
                        RecordedRequest(name, self.command, parsed.path, query, headers, body, status)
                    )

            fault = s.take_fault(name)
            if fault and fault.kind in ("timeout", "disconnect"):
                record(0)
                time.sleep(fault.seconds)
                self.close_connection = True
                return
            with s.lock:
                answer = self._answer(fault, fn, groups, query, body, headers)
                if answer.status != 304 and answer.headers.get("X-RateLimit-Remaining") != "0":
                    s.rate_remaining = max(0, s.rate_remaining - 1)
                answer.headers.setdefault("X-RateLimit-Limit", str(s.rate_limit))
                answer.headers.setdefault("X-RateLimit-Remaining", str(s.rate_remaining))
                answer.headers.setdefault("X-RateLimit-Reset", str(s.now + 3600))
                answer.headers.setdefault("X-RateLimit-Used", str(s.rate_limit - s.rate_remaining))
                answer.headers["X-RateLimit-Resource"] = "core"
            record(answer.status)
            self._write(answer)

        def _answer(
            self, fault: Fault | None, fn: Route | None, groups: dict, query: dict, body: Any, headers: dict
        ) -> Answer:
            s = state
            if fault and fault.kind == "status":
                return Answer(fault.status, shapes.error("Server Error", fault.status))
            if fault and fault.kind == "secondary":
                retry = {"Retry-After": f"{fault.seconds:g}"}
                return Answer(fault.status, shapes.error(SECONDARY_LIMIT_MESSAGE, fault.status), retry)
            if fault and fault.kind == "primary":
                limit = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(fault.reset_at)}
                return Answer(403, shapes.error("API rate limit exceeded for installation ID 1.", 403), limit)
            if fn is None or (groups.get("owner", s.owner), groups.get("repo", s.name)) != (s.owner, s.name):
                return Answer(404, shapes.error("Not Found", 404))
            try:
                answer = fn(s, (groups, query, body))
            except Refusal as refusal:
                return Answer(refusal.status, shapes.error(refusal.message, refusal.status))
            if self.command == "GET" and answer.status == 200 and not isinstance(answer.body, bytes):
                tag = _etag(json.dumps(answer.body, sort_keys=True).encode())
                answer.headers["ETag"] = tag
                if headers.get("if-none-match", "").removeprefix("W/") == tag.removeprefix("W/"):
                    return Answer(304, None, {"ETag": tag})
            return answer

        def _write(self, answer: Answer) -> None:
            if isinstance(answer.body, bytes):
                payload = answer.body
            elif answer.body is None:
                payload = b""
            else:
                payload = json.dumps(answer.body, separators=(",", ":")).encode()
                answer.headers.setdefault("Content-Type", "application/json; charset=utf-8")
            self.send_response(answer.status)
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.send_header("X-GitHub-Media-Type", "github.v3; format=json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if payload and answer.status != 304:
                self.wfile.write(payload)

    return Handler
