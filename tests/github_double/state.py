"""The GitHub test double's state: one repository's PRs, comments, labels, statuses and Actions runs.

Tests change it directly (add a PR, push a new head, queue faults) while the server reads and writes it
from its request threads; every public method takes the lock. Times come from a settable clock, so JSON
bodies, and therefore ETags, are deterministic.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import io
import re
import threading
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

START = int(dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp())
SECONDARY_LIMIT_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID 0000:DOUBLE."
)


def fake_sha(*parts: object) -> str:
    """A stable 40-hex sha for objects that do not live in a real git repository."""
    return hashlib.sha1(" ".join(map(str, parts)).encode()).hexdigest()


@dataclass(frozen=True)
class Fault:
    """One injected misbehaviour, consumed by the next request to its route."""

    kind: str  # "status", "timeout", "disconnect", "secondary", "primary", "pass"
    status: int = 502
    seconds: float = 0.0  # timeout: how long to hang before dropping; secondary: Retry-After
    reset_at: int = 0  # primary: the X-RateLimit-Reset epoch

    @classmethod
    def passthrough(cls) -> Fault:
        """No fault: answer this request normally, so that a queue can aim at a later one."""
        return cls("pass")

    @classmethod
    def server_error(cls, status: int = 502) -> Fault:
        """A 5xx answer with GitHub's error body."""
        return cls("status", status=status)

    @classmethod
    def timeout(cls, seconds: float) -> Fault:
        """Hang for ``seconds`` (longer than the client's timeout), then drop the connection unanswered."""
        return cls("timeout", seconds=seconds)

    @classmethod
    def disconnect(cls) -> Fault:
        """Drop the connection at once without answering."""
        return cls("disconnect")

    @classmethod
    def secondary_limit(cls, retry_after: float = 60, status: int = 403) -> Fault:
        """GitHub's secondary rate limit: 403 (or 429) with Retry-After."""
        return cls("secondary", status=status, seconds=retry_after)

    @classmethod
    def primary_limit(cls, reset_at: int) -> Fault:
        """GitHub's primary rate limit: 403, X-RateLimit-Remaining 0, reset at epoch ``reset_at``."""
        return cls("primary", status=403, reset_at=reset_at)


@dataclass
class FileState:
    filename: str
    status: str  # added, removed, modified, renamed
    additions: int
    deletions: int
    patch: str | None  # None: GitHub omits it (binary or too large)
    previous_filename: str | None = None


@dataclass
class CommitState:
    sha: str
    message: str
    author_name: str
    author_email: str
    committer_name: str
    committer_email: str
    author_date: str
    committer_date: str
    parents: list[str] = field(default_factory=list)


@dataclass
class PullState:
    number: int
    title: str
    body: str | None
    author: str
    head_ref: str
    head_sha: str
    base_ref: str
    base_sha: str
    created_at: str
    updated_at: str
    files: list[FileState] = field(default_factory=list)
    commits: list[CommitState] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    author_association: str = "CONTRIBUTOR"
    state: str = "open"
    draft: bool = False
    merged: bool = False
    merge_commit_sha: str | None = None
    merged_by: str | None = None
    closed_at: str | None = None
    merged_at: str | None = None
    mergeable: bool | None = True
    mergeable_state: str = "clean"
    mergeable_null_polls: int = 0  # the next N GETs answer mergeable: null (GitHub still computing)
    # Set by tests.github_double.gitrepo for PRs backed by a real bare repository: does the merge in git.
    merger: Callable[[PullState, str, str, str], str] | None = None


@dataclass
class CommentState:
    id: int
    issue: int
    author: str
    body: str
    created_at: str
    updated_at: str


@dataclass
class StatusState:
    id: int
    sha: str
    state: str
    context: str
    description: str | None
    target_url: str | None
    created_at: str
    creator: str


@dataclass
class RunState:
    id: int
    workflow_file: str
    workflow_id: int
    run_number: int
    head_branch: str
    head_sha: str
    event: str
    inputs: dict[str, Any]
    created_at: str
    updated_at: str
    status: str = "queued"
    conclusion: str | None = None
    actor: str = "evalbot[bot]"
    display_title: str = ""  # the workflow's run-name rendered with the inputs; "" when it has none
    runner_name: str | None = None  # the self-hosted runner that picked the job up, once one has


@dataclass
class ArtifactState:
    id: int
    run_id: int
    name: str
    data: bytes
    created_at: str
    expired: bool = False


@dataclass(frozen=True)
class RecordedRequest:
    """One request the double received, as the client sent it."""

    route: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: Any
    status: int  # what the double answered; 0 when it dropped the connection instead


_INPUT_EXPRESSION = re.compile(r"\$\{\{\s*inputs\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}")


def render_run_name(template: str, inputs: Mapping[str, Any]) -> str:
    """A run-name with each ``${{ inputs.NAME }}`` replaced by the input (GitHub renders a missing one as "")."""
    return _INPUT_EXPRESSION.sub(lambda m: str(inputs.get(m.group(1), "")), template)


def zip_bytes(files: Mapping[str, bytes | str]) -> bytes:
    """A zip archive holding ``files`` (name -> content), as Actions stores an artifact."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buf.getvalue()


class GitHubState:
    """Everything the double knows; tests mutate it, the server serves it."""

    def __init__(self, owner: str = "contest", name: str = "engine", bot: str = "evalbot[bot]"):
        self.lock = threading.RLock()
        self.owner, self.name, self.bot = owner, name, bot
        self.base_url = ""  # set by the server once it has a port
        self.clone_url = ""  # file:// URL of the bare repository, when one backs the PRs
        self.now = START
        self.rate_limit, self.rate_remaining = 5000, 5000
        self.pulls: dict[int, PullState] = {}
        self.comments: dict[int, CommentState] = {}
        self.statuses: list[StatusState] = []
        self.workflows: dict[str, int] = {}  # file name -> workflow id
        self.run_names: dict[str, str] = {}  # file name -> its `run-name:` expression, if it has one
        self.refs: dict[str, str] = {}  # branch -> sha, for dispatch refs
        self.runs: dict[int, RunState] = {}
        self.artifacts: dict[int, ArtifactState] = {}
        self.users_by_email: dict[str, str] = {}  # how GitHub maps a commit's email to an account
        self.allowed_merge_methods = {"merge", "squash"}
        self.run_details_supported = True  # dispatch honours return_run_details (200 + run id) or answers 204
        self.files_cap, self.commits_cap = 3000, 250  # GitHub lists no more of a PR
        self.requests: list[RecordedRequest] = []
        self.faults: dict[str, collections.deque[Fault]] = collections.defaultdict(collections.deque)
        self._ids = iter(range(1_000_001, 10**9))

    # --- time and ids ---

    def iso(self, epoch: int | None = None) -> str:
        """An epoch second as GitHub prints times."""
        moment = dt.datetime.fromtimestamp(self.now if epoch is None else epoch, dt.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    def tick(self, seconds: int = 1) -> str:
        """Advance the clock (every change does, so updated_at moves) and return the new time."""
        with self.lock:
            self.now += seconds
            return self.iso()

    def new_id(self) -> int:
        """A fresh id for comments, statuses, runs and artifacts."""
        with self.lock:
            return next(self._ids)

    # --- setup by tests ---

    def add_pull(
        self, number: int, *, author: str = "octo", head_sha: str | None = None, **fields: Any
    ) -> PullState:
        """Register an open PR with fake shas, one commit and one file (gitrepo.add_git_pull makes real ones)."""
        with self.lock:
            if number in self.pulls:
                raise ValueError(f"PR #{number} already exists in the double")
            now = self.tick()
            head_sha = head_sha or fake_sha("head", number)
            defaults: dict[str, Any] = {
                "title": f"PR {number}",
                "body": f"Body of PR {number}",
                "head_ref": f"pr-{number}",
                "base_ref": "main",
                "base_sha": self.refs.get("main") or fake_sha("main"),
                "files": [FileState("engine/generate.py", "modified", 1, 1, "@@ -1 +1 @@\n-slow\n+fast")],
                "commits": [self._fake_commit(author, head_sha, f"PR {number}")],
            }
            pull = PullState(
                number=number,
                author=author,
                head_sha=head_sha,
                created_at=now,
                updated_at=now,
                **{**defaults, **fields},
            )
            self.pulls[number] = pull
            self.refs[pull.head_ref] = pull.head_sha
            self.refs.setdefault(pull.base_ref, pull.base_sha)
            return pull

    def _fake_commit(self, login: str, sha: str, message: str) -> CommitState:
        email = f"{login}@users.noreply.github.com"
        self.users_by_email[email] = login
        now = self.iso()
        return CommitState(sha, message, login.title(), email, login.title(), email, now, now)

    def push(
        self,
        number: int,
        head_sha: str,
        *,
        commits: Iterable[CommitState] | None = None,
        files: Iterable[FileState] | None = None,
    ) -> None:
        """A new head for the PR, as after a push; ``commits`` replace the PR's list (default: one more fake)."""
        with self.lock:
            pull = self.pulls[number]
            pull.updated_at = self.tick()
            pull.head_sha = head_sha
            pull.commits = (
                list(commits)
                if commits is not None
                else [*pull.commits, self._fake_commit(pull.author, head_sha, "push")]
            )
            if files is not None:
                pull.files = list(files)
            self.refs[pull.head_ref] = head_sha

    def set_mergeable(
        self, number: int, mergeable: bool | None, state: str = "", null_polls: int = 0
    ) -> None:
        """What GitHub says of mergeability; ``null_polls`` GETs answer null first."""
        with self.lock:
            pull = self.pulls[number]
            pull.mergeable = mergeable
            pull.mergeable_state = state or {True: "clean", False: "dirty", None: "unknown"}[mergeable]
            pull.mergeable_null_polls = null_polls

    def inject(self, route: str, *faults: Fault) -> None:
        """Queue faults for a route (see server.ROUTES), or "*" for whichever route comes next."""
        with self.lock:
            self.faults[route].extend(faults)

    def take_fault(self, route: str) -> Fault | None:
        """The next queued fault for this request, if any."""
        with self.lock:
            for key in (route, "*"):
                if self.faults[key]:
                    return self.faults[key].popleft()
            return None

    def add_workflow(self, file: str, run_name: str | None = None) -> int:
        """A workflow with a workflow_dispatch trigger; returns its id.

        ``run_name`` is the workflow's ``run-name:``; its ``${{ inputs.NAME }}`` become each run's display title.
        """
        with self.lock:
            if run_name is not None:
                self.run_names[file] = run_name
            return self.workflows.setdefault(file, 100 + len(self.workflows))

    def start_run(
        self, workflow_file: str, ref: str, inputs: Mapping[str, Any], event: str = "workflow_dispatch"
    ) -> RunState:
        """A queued run, as a dispatch creates one."""
        with self.lock:
            now = self.tick()
            run = RunState(
                id=self.new_id(),
                workflow_file=workflow_file,
                workflow_id=self.workflows[workflow_file],
                run_number=1 + sum(r.workflow_file == workflow_file for r in self.runs.values()),
                head_branch=ref,
                head_sha=self.refs[ref],
                event=event,
                inputs=dict(inputs),
                created_at=now,
                updated_at=now,
                display_title=render_run_name(self.run_names.get(workflow_file, ""), inputs),
            )
            self.runs[run.id] = run
            return run

    def pick_up_run(self, run_id: int, runner_name: str) -> RunState:
        """A runner takes the run's job: it is in progress on ``runner_name``."""
        with self.lock:
            run = self.runs[run_id]
            run.status, run.runner_name, run.updated_at = "in_progress", runner_name, self.tick()
            return run

    def complete_run(
        self,
        run_id: int,
        conclusion: str = "success",
        artifacts: Mapping[str, Mapping[str, bytes | str]] | None = None,
    ) -> list[ArtifactState]:
        """Finish a run and attach artifacts (name -> {path: content}), zipped as Actions does."""
        with self.lock:
            run = self.runs[run_id]
            run.status, run.conclusion, run.updated_at = "completed", conclusion, self.tick()
            return [
                self.add_artifact(run_id, name, zip_bytes(files)) for name, files in (artifacts or {}).items()
            ]

    def add_artifact(self, run_id: int, name: str, data: bytes) -> ArtifactState:
        """Attach raw zip bytes to a run (for archives no honest uploader makes)."""
        with self.lock:
            artifact = ArtifactState(self.new_id(), run_id, name, data, self.tick())
            self.artifacts[artifact.id] = artifact
            return artifact

    # --- what tests read back ---

    def calls(self, route: str) -> list[RecordedRequest]:
        """The requests received for one route, oldest first."""
        with self.lock:
            return [r for r in self.requests if r.route == route]

    def comments_on(self, number: int) -> list[CommentState]:
        """The comments on one PR, oldest first."""
        with self.lock:
            return sorted((c for c in self.comments.values() if c.issue == number), key=lambda c: c.id)
