"""The double and the adapter against real api.github.com traffic (PyGithub's recordings).

Two checks. The double answers every endpoint the bot uses with the keys the bot reads, of the same JSON
types as GitHub's recorded answers (the keys are found by running the adapter's own parsers over the
recording and noting each key they touch). And the adapter, replayed the recorded answers through a
local server, turns them into the right facts.
"""

from __future__ import annotations

import ast
import json
import random
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from evalbot.github import (
    GitHubError,
    PyGithubAdapter,
    artifact_from_json,
    comment_from_json,
    commit_from_json,
    file_from_json,
    pull_from_json,
    run_from_json,
)
from evalbot.model import MergeOutcome
from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.serve import Double, serve
from tests.github_double.state import CommentState, FileState

RECORDINGS = Path(__file__).resolve().parents[2].parent / "shared" / "github-recordings"
pytestmark = pytest.mark.skipif(
    not RECORDINGS.is_dir(), reason=f"GitHub recordings not found at {RECORDINGS} (shared checkout absent)"
)


# --- the recordings ---


@dataclass(frozen=True)
class Exchange:
    """One recorded request and GitHub's answer."""

    verb: str
    path: str  # with the query
    request_body: str | None
    status: int
    headers: list[tuple[str, str]]
    body: str


def load(name: str) -> list[Exchange]:
    """The exchanges of one recording file (10-line blocks separated by a blank line)."""
    lines = (RECORDINGS / name).read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        block = lines[i : i + 10]
        if len(block) < 10:
            raise ValueError(f"{name}: truncated exchange at line {i + 1}")
        body = None if block[6] == "None" else block[6]
        out.append(Exchange(block[1], block[4], body, int(block[7]), ast.literal_eval(block[8]), block[9]))
        i += 10  # an empty response body is itself a blank line, so count rather than skip
    return out


def recorded(name: str, verb: str, path_pattern: str) -> Any:
    """The JSON answer of the first exchange in ``name`` matching the verb and a path prefix."""
    for exchange in load(name):
        if exchange.verb == verb and exchange.path.split("?")[0].endswith(path_pattern):
            return json.loads(exchange.body) if exchange.body else None
    raise LookupError(f"{name} has no {verb} ...{path_pattern}")


# --- which keys a parser reads ---


class _Reads:
    def __init__(self) -> None:
        self.paths: set[tuple[str, ...]] = set()


def _track(value: Any, path: tuple[str, ...], reads: _Reads) -> Any:
    if isinstance(value, dict):
        return _TrackedDict(value, path, reads)
    if isinstance(value, list):
        return [_track(v, (*path, "[]"), reads) for v in value]
    return value


class _TrackedDict(dict):
    """A dict that notes every key looked up in it, by its path from the root."""

    def __init__(self, data: dict, path: tuple[str, ...], reads: _Reads):
        super().__init__(data)
        self._path, self._reads = path, reads

    def __getitem__(self, key: str) -> Any:
        self._reads.paths.add((*self._path, key))
        return _track(super().__getitem__(key), (*self._path, key), self._reads)

    def get(self, key: str, default: Any = None) -> Any:
        self._reads.paths.add((*self._path, key))
        return self[key] if key in self else default  # noqa: SIM401 - self[key] tracks what is read below it


def keys_read(parse: Callable[[Any], Any], body: Any) -> set[tuple[str, ...]]:
    """The key paths ``parse`` looks up in ``body`` ("[]" stands for every item of a list)."""
    reads = _Reads()
    parse(_track(body, (), reads))
    return reads.paths


_MISSING = object()


def values_at(body: Any, path: tuple[str, ...]) -> list[Any]:
    """Every value at ``path`` (fanning out at "[]"); a missing key gives the _MISSING marker."""
    values = [body]
    for key in path:
        nxt: list[Any] = []
        for v in values:
            if key == "[]":
                nxt.extend(v if isinstance(v, list) else [])
            elif isinstance(v, dict):
                nxt.append(v.get(key, _MISSING))
            elif v is not None and v is not _MISSING:
                nxt.append(_MISSING)
        values = nxt
    return values


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def assert_same_shape(real: Any, double: Any, paths: set[tuple[str, ...]], what: str) -> int:
    """Every path present in ``real`` is present in ``double`` with the same type (null matches anything)."""
    checked = 0
    for path in sorted(paths):
        real_values = [v for v in values_at(real, path) if v is not _MISSING]
        if not real_values:
            continue  # the recording lacks it (older API): nothing to compare with
        double_values = values_at(double, path)
        where = f"{what}: {'.'.join(path)}"
        assert double_values, f"{where}: the double's answer has no items at this level to compare"
        assert _MISSING not in double_values, f"{where}: missing from the double's answer"
        real_types = {json_type(v) for v in real_values} - {"null"}
        double_types = {json_type(v) for v in double_values} - {"null"}
        if real_types and double_types:
            assert double_types == real_types, (
                f"{where}: GitHub sends {real_types}, the double {double_types}"
            )
        checked += 1
    return checked


def top_keys(body: Any) -> set[tuple[str, ...]]:
    """The top-level keys of an object, or of a list's items."""
    if isinstance(body, list):
        return {("[]", k) for item in body for k in item}
    return {(k,) for k in body}


# --- the double, filled with one of everything ---


@pytest.fixture(scope="module")
def double(tmp_path_factory) -> Iterator[tuple[Double, dict[str, int]]]:
    """A double holding a git-backed PR with comments and labels, a renamed file, and a finished run."""
    with serve() as d:
        s = d.state
        repo = BareRepo.create(
            tmp_path_factory.mktemp("git") / "engine.git", {"a.py": "a = 1\n", "b.py": "b\n"}, s.now
        )
        add_git_pull(s, repo, 1, {"a.py": "a = 2\n", "c.py": "c\n", "b.py": None}, body="Faster")
        s.pulls[1].labels = ["perf", "queued"]
        s.add_pull(
            2, files=[FileState("b2.py", "renamed", 0, 0, None, "b.py")], labels=["perf", "stale"], body=None
        )
        comment = CommentState(s.new_id(), 1, "octo", "Nice", s.iso(), s.iso())
        s.comments[comment.id] = comment
        s.add_workflow("speed.yml")
        run = s.start_run("speed.yml", "pr-1", {"pr": "1"})
        s.complete_run(run.id, "success", {"measurements": {"result.json": "{}"}})
        yield d, {"comment": comment.id, "run": run.id}


def _call(d: Double, verb: str, path: str, body: Any = None) -> Any:
    r = requests.request(verb, d.base_url + path, json=body, timeout=5, allow_redirects=False)
    return r.json() if r.content else None


@dataclass(frozen=True)
class Case:
    """One endpoint: GitHub's recorded answer, what the bot reads of it, and the same request to the double."""

    name: str
    recording: str
    verb: str
    suffix: str  # the end of the recorded path
    parse: Callable[[Any], Any]
    ask: tuple[str, str, Any]  # the double's request; {comment} and {run} are filled in
    item: int | None = None  # compare this item of a recorded list (a GET of what the double POSTs)


R = "/repos/contest/engine"
STATUS = {"state": "success", "context": "evalbot", "description": "d", "target_url": "https://x.invalid"}
CASES = [
    Case("pull", "PullRequest.setUp.txt", "GET", "/pulls/21", lambda b: (pull_from_json(b), b.get("mergeable"), b.get("mergeable_state"), b.get("changed_files"), b.get("commits")), ("GET", f"{R}/pulls/1", None)),
    Case("pull-2012", "PullRequest.setUp.txt", "GET", "/pulls/31", pull_from_json, ("GET", f"{R}/pulls/2", None)),
    Case("pull list", "Repository.testGetPulls.txt", "GET", "/pulls", lambda b: [pull_from_json(p) for p in b], ("GET", f"{R}/pulls", None)),
    Case("pull files", "PullRequest.testGetFiles.txt", "GET", "/files", lambda b: [file_from_json(f) for f in b], ("GET", f"{R}/pulls/1/files", None)),
    Case("pull commits", "PullRequest.testGetCommits.txt", "GET", "/commits", lambda b: [commit_from_json(c) for c in b], ("GET", f"{R}/pulls/1/commits", None)),
    Case("comments", "PullRequest.testGetIssueComments.txt", "GET", "/comments", lambda b: [comment_from_json(c) for c in b], ("GET", f"{R}/issues/1/comments", None)),
    Case("new comment", "Issue.testCreateComment.txt", "POST", "/comments", comment_from_json, ("POST", f"{R}/issues/1/comments", {"body": "hi"})),
    Case("edited comment", "IssueComment.testEdit.txt", "PATCH", "/comments/20227753", comment_from_json, ("PATCH", R + "/issues/comments/{comment}", {"body": "x"})),
    Case("labels added", "PullRequest.testAddAndRemoveLabels.txt", "POST", "/labels", lambda b: [x["name"] for x in b], ("POST", f"{R}/issues/1/labels", {"labels": ["x"]})),
    Case("labels set", "PullRequest.testDeleteAndSetLabels.txt", "PUT", "/labels", lambda b: [x["name"] for x in b], ("PUT", f"{R}/issues/1/labels", {"labels": ["perf", "y"]})),
    Case("label removed", "PullRequest.testAddAndRemoveLabels.txt", "DELETE", "/labels/wip", lambda b: None, ("DELETE", f"{R}/issues/2/labels/stale", None)),
    Case("issue", "IssueComment.setUp.txt", "GET", "/issues/28", lambda b: None, ("PATCH", f"{R}/issues/2", {"state": "open"})),
    Case("status", "CommitStatus.setUp.txt", "GET", "/statuses/1292bf0e22c796e91cc3d6e24b544aece8c21f2a", lambda b: None, ("POST", f"{R}/statuses/{'a' * 40}", STATUS), item=0),
    Case("runs", "Workflow.testGetRunsWithHeadSha.txt", "GET", "/runs", lambda b: [run_from_json(r) for r in b["workflow_runs"]], ("GET", f"{R}/actions/workflows/speed.yml/runs", None)),
    Case("run", "WorkflowRun.setUp.txt", "GET", "/actions/runs/3881497935", run_from_json, ("GET", R + "/actions/runs/{run}", None)),
    Case("artifacts", "Artifact.testGetArtifactsFromWorkflow.txt", "GET", "/artifacts", lambda b: [artifact_from_json(a) for a in b["artifacts"]], ("GET", R + "/actions/runs/{run}/artifacts", None)),
    Case("dispatch", "Workflow.testCreateDispatchWithReturnRunDetails.txt", "POST", "/dispatches", lambda b: b.get("workflow_run_id"), ("POST", f"{R}/actions/workflows/speed.yml/dispatches", {"ref": "main", "return_run_details": True})),
    Case("error", "PullRequest.testMerge.txt", "GET", "/pulls/31/merge", lambda b: b.get("message"), ("GET", f"{R}/pulls/404", None)),
    Case("rate limit", "RateLimiting.testGetRateLimit.txt", "GET", "/rate_limit", lambda b: b["resources"]["core"]["remaining"], ("GET", "/rate_limit", None)),
    Case("user", "CommitStatus.setUp.txt", "GET", "/user", lambda b: b["login"], ("GET", "/user", None)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_double_answers_what_the_bot_reads_in_githubs_shapes(double, case: Case):
    d, ids = double
    real = recorded(case.recording, case.verb, case.suffix)
    real = real[case.item] if case.item is not None else real
    verb, path, body = case.ask
    answer = _call(d, verb, path.format(**ids), body)
    read = keys_read(case.parse, real)
    present = {p for p in read if any(v is not _MISSING for v in values_at(real, p))}
    assert assert_same_shape(real, answer, read, case.name) == len(present)
    # Beyond what the bot reads, the double carries every top-level key GitHub sent (other clients may read them).
    assert_same_shape(real, answer, top_keys(real), f"{case.name} (top level)")


def test_the_merge_answers_have_githubs_shape(double):
    d, _ = double
    s = d.state
    s.add_pull(30)
    s.add_pull(31)
    real = recorded("PullRequest.testMerge.txt", "PUT", "/pulls/31/merge")
    merged = _call(d, "PUT", f"{R}/pulls/30/merge", {"sha": s.pulls[30].head_sha, "merge_method": "squash"})
    parse = lambda b: (b.get("merged"), b.get("message"), b.get("sha"))  # noqa: E731
    assert assert_same_shape(real, merged, keys_read(parse, real) | top_keys(real), "merge") == 3
    moved = _call(d, "PUT", f"{R}/pulls/31/merge", {"sha": "0" * 40})
    real_error = recorded("Workflow.testCreateDispatchException.txt", "POST", "/dispatches")
    assert assert_same_shape(real_error, moved, top_keys(real_error), "409") == 2


def test_the_recording_parser_keeps_empty_bodies_in_their_block():
    merge = load("PullRequest.testMerge.txt")
    assert [(e.verb, e.status, e.body) for e in merge][2] == ("GET", 204, "")
    assert [e.status for e in merge] == [404, 200, 204]


def test_key_tracking_sees_reads_through_get_and_lists():
    body = {"a": {"b": 1}, "items": [{"name": "x"}, {"name": "y"}], "n": None}
    assert keys_read(
        lambda b: (b["a"]["b"], [i["name"] for i in b["items"]], b.get("n"), b.get("zz")), body
    ) == {("a",), ("a", "b"), ("items",), ("items", "[]", "name"), ("n",), ("zz",)}
    with pytest.raises(AssertionError, match=r"x: a\.b: GitHub sends \{'number'\}, the double \{'string'\}"):
        assert_same_shape(body, {"a": {"b": "1"}}, {("a", "b")}, "x")
    with pytest.raises(AssertionError, match="missing from the double"):
        assert_same_shape(body, {"a": {}}, {("a", "b")}, "x")


# --- replaying recordings to the adapter ---


class _Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no ~40 ms delayed-ACK wait on every response (see the GitHub double)
    exchanges: list[Exchange]
    served: list[tuple[str, str]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        asked = dict(urllib.parse.parse_qsl(query))
        for i, e in enumerate(self.exchanges):
            e_path, _, e_query = e.path.partition("?")
            if (
                e.verb == self.command
                and e_path == path
                and dict(urllib.parse.parse_qsl(e_query)).items() <= asked.items()
            ):
                del self.exchanges[i]
                self.served.append((self.command, self.path))
                self._answer(e.status, e.headers, e.body.encode())
                return
        self._answer(
            501, [], json.dumps({"message": f"no recorded exchange for {self.command} {self.path}"}).encode()
        )

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _answer(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            # Framing headers describe the original connection; this one frames its own.
            if key.lower() not in (
                "status",
                "content-length",
                "transfer-encoding",
                "connection",
                "content-encoding",
            ):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def replay() -> Iterator[Callable[..., tuple[PyGithubAdapter, list]]]:
    servers = []

    def start(repo: str, *exchanges: Exchange) -> tuple[PyGithubAdapter, list]:
        handler = type("Replay", (_Replay,), {"exchanges": list(exchanges), "served": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        adapter = PyGithubAdapter.from_token(
            repo, "t", base_url=base, pace=False, sleep=_no_sleep, rng=random.Random(0)
        )
        return adapter, handler.served

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"a replayed exchange made the adapter wait {seconds}s")


def test_replayed_pull_with_files_and_commits_becomes_facts(replay):
    pull = [e for e in load("PullRequest.setUp.txt") if e.path.endswith("/pulls/31")]
    adapter, served = replay(
        "PyGithub/PyGithub",
        *pull,
        *load("PullRequest.testGetFiles.txt"),
        *load("PullRequest.testGetCommits.txt"),
    )
    facts = adapter.get_pull(31)
    assert (facts.number, facts.author, facts.author_association, facts.merged, facts.draft) == (
        31,
        "jacquev6",
        "MEMBER",
        True,
        False,
    )
    assert (facts.head_sha, facts.base_ref) == (
        "8a4f306d4b223682dd19410d4a9150636ebe4206",
        "topic/RewriteWithGeneratedCode",
    )
    assert len(facts.files) == 45 and facts.incomplete == ()
    first = facts.files[0]
    assert (first.path, first.status, first.additions, first.deletions) == (
        "codegen/templates/GithubObject.py",
        "modified",
        1,
        1,
    )
    assert first.patch.startswith("@@ -70,7 +70,7 @@")
    assert [c.sha[:7] for c in facts.commits] == ["4aadfff", "93dcae5", "8a4f306"]
    assert {(c.author, c.author_name, c.committer_name) for c in facts.commits} == {
        ("jacquev6", "Vincent Jacques", "Vincent Jacques")
    }
    assert [verb for verb, _ in served] == ["GET", "GET", "GET"]


def test_replayed_open_pulls_become_facts(replay):
    adapter, _ = replay("PyGithub/PyGithub", *load("Repository.testGetPulls.txt"))
    pulls = adapter.list_open_pulls()
    assert pulls and all(p.state == "open" and len(p.head_sha) == 40 and p.author for p in pulls)


def test_replayed_merges(replay):
    adapter, served = replay(
        "PyGithub/PyGithub",
        *load("PullRequest.testMerge.txt"),
        *load("PullRequest.testMergeWithCommitMessage.txt"),
    )
    result = adapter.merge(31, "8a4f306d4b223682dd19410d4a9150636ebe4206")
    assert (result.outcome, result.sha) == (MergeOutcome.MERGED, "688208b1a5a074871d0e9376119556897439697d")
    assert result.message == "Pull Request successfully merged"
    result = adapter.merge(39, "0" * 40, "merge", message="Custom commit message created by PyGithub")
    assert (result.outcome, result.sha) == (MergeOutcome.MERGED, "2525d86ae3bf7d26003e2a6d5226a8d870499792")
    assert served == [
        ("PUT", "/repos/PyGithub/PyGithub/pulls/31/merge"),
        ("PUT", "/repos/PyGithub/PyGithub/pulls/39/merge"),
    ]


def test_replayed_comments(replay):
    adapter, _ = replay(
        "PyGithub/PyGithub", *load("Issue.testCreateComment.txt"), *load("IssueComment.testEdit.txt"), *load("PullRequest.testGetIssueComments.txt")
    )  # fmt: skip
    created = adapter.create_comment(28, "Comment created by PyGithub")
    assert (created.id, created.author, created.body, created.created_at) == (
        5808311,
        "jacquev6",
        "Comment created by PyGithub",
        "2012-05-20T11:46:42Z",
    )
    edited = adapter.edit_comment(20227753, "Comment edited by PyGithub")
    assert (edited.id, edited.body, edited.updated_at) == (
        20227753,
        "Comment edited by PyGithub",
        "2012-05-20T11:53:59Z",
    )
    (listed,) = adapter.list_comments(31)
    assert (listed.id, listed.body) == (8387331, "Issue comment created by PyGithub")


def test_replayed_labels(replay):
    adapter, served = replay(
        "PyGithub/PyGithub",
        *load("PullRequest.testAddAndRemoveLabels.txt"),
        *load("PullRequest.testDeleteAndSetLabels.txt"),
    )
    adapter.remove_label(31, "wip")
    assert adapter.add_labels(31, ["wip", "refactoring"]) == ("wip", "refactoring", "improvement")
    assert [verb for verb, _ in served] == ["DELETE", "POST"]


def test_replayed_actions_runs_artifacts_and_dispatches(replay):
    adapter, _ = replay(
        "PyGithub/PyGithub", *load("Workflow.testGetRunsWithHeadSha.txt"), *load("WorkflowRun.setUp.txt")
    )
    (run,) = adapter.list_workflow_runs("1026390", head_sha="3a6235b56eecc0e193c1e267b064c155c6ebc022")
    assert (run.id, run.name, run.status, run.conclusion, run.event) == (
        3349872717,
        "CI",
        "completed",
        "success",
        "push",
    )
    assert run.head_sha == "3a6235b56eecc0e193c1e267b064c155c6ebc022" and run.workflow_id == 1903133
    assert adapter.get_workflow_run(3881497935).id == 3881497935

    adapter, _ = replay(
        "transmission-web-control/transmission-web-control",
        *load("Artifact.testGetArtifactsFromWorkflow.txt"),
    )
    first, second = adapter.list_run_artifacts(5138169628)
    assert (first.id, first.name, first.size_in_bytes, first.expired, first.run_id) == (
        724958104,
        "build-tar",
        1596716,
        False,
        5138169628,
    )
    assert second.run_id == 5138169628

    adapter, _ = replay(
        "wrecker/PyGithub",
        *load("Workflow.testCreateDispatchWithReturnRunDetails.txt"),
        *load("Workflow.testCreateDispatchWithString.txt"),
    )
    assert (
        adapter.dispatch_workflow("2001227", "main", {"logLevel": "Warning", "message": "Log Message"})
        == 123456789
    )
    assert adapter.dispatch_workflow("2001227", "main", {"logLevel": "Warning"}) is None

    adapter, _ = replay("test-org/test-repo", *load("Workflow.testCreateDispatchException.txt"))
    with pytest.raises(GitHubError, match=r"HTTP 422: Required input 'mandatory-parameter' not provided"):
        adapter.dispatch_workflow("96985305", "main", {})
