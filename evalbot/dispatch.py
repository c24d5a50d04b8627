"""Evaluations on a pool of self-hosted GitHub Actions runners: dispatch, track, collect, verify.

In ``actions`` mode the bot measures nothing itself. It dispatches ``rules.dispatch.workflow`` on
``rules.dispatch.ref`` (trusted main), follows the run, downloads its artifact and believes it only when
the receipt is signed by one of ``rules.dispatch.runner_public_keys``, names the requested PR, head,
base and rules, and its verdict is the one ``verdict.decide`` gives for its measurements. Anything else
is an INFRA_ERROR that never reaches the PR as a verdict; a bad signature or a receipt answering for
something else also raises an alert for a maintainer.

The workflow's contract (what this module relies on):

- ``on: workflow_dispatch`` with string inputs ``pr``, ``head_sha``, ``base_sha``, ``profile``,
  ``request_id`` and ``exclude_runner`` (comma-separated runner names; the job fails at once when
  ``runner.name`` is one of them, so a retry does not land on the box that just failed);
- a ``run-name`` holding the request id as a word of its own, e.g.
  ``run-name: "evalbot #${{ inputs.pr }} ${{ inputs.request_id }}"``: GitHub answers a dispatch with
  the run id only when asked for ``return_run_details`` and able to, and otherwise this is how the bot
  finds its run among the workflow's runs;
- the job runs ``evalbot evaluate --repo . --base BASE --head HEAD --profile P --out out --key KEYFILE``
  and uploads ``out/`` (result.json, receipt.json, report.md at the archive's top level) as the artifact
  ``evalbot-result-<request_id>`` with ``if: always()``: evaluate exits 1 on a REJECT, so a run whose
  conclusion is ``failure`` may still hold a verdict, and its signed receipt decides.

GitHub picks the runner; this module records the one a failed run used (through ``RunnerLookup``, the
run's jobs) and passes it in ``exclude_runner`` on the retry. Handles live in the store's file
(``DispatchRuns``), written before each dispatch, so a restarted poller picks up its in-flight runs.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from evalbot import receipts, times, verdict
from evalbot.github import ArtifactRejected, GitHubError, GitHubPort, GitHubUnavailable
from evalbot.judge import Judgement
from evalbot.model import Measurements, Status, Verdict, WorkflowRun, from_dict
from evalbot.rules import Rules
from evalbot.store import require_tables

ARTIFACT_PREFIX = "evalbot-result-"
RESULT_FILE, RECEIPT_FILE = "result.json", "receipt.json"
# A dispatch whose run id GitHub did not return must show up in the run list within this long; past
# it the dispatch is taken as lost (a crash before the call, or a call GitHub never acted on).
DISCOVERY_S = 15 * 60
RUN_LIST_LIMIT = 100  # the newest runs of the workflow searched for a request id
# Conclusions after which the artifact is worth reading: evaluate exits non-zero on a REJECT.
_READABLE = frozenset({"success", "failure"})
_GIT_SHA = re.compile(r"[0-9a-f]{40}")
_REQUEST_ID = re.compile(r"[a-z0-9][a-z0-9-]{7,99}")
_RUNNER_NAME = re.compile(r"[^,\s]+")

# (run id) -> the name of the runner that took the run's job, or None when none did or it is unknown
RunnerLookup = Callable[[int], "str | None"]


# ---------------------------------------------------------------- requests, handles, outcomes


@dataclass(frozen=True)
class DispatchRequest:
    """One attempt at one evaluation: what to measure, under which rules, and the id its run carries."""

    pr: int
    head_sha: str
    base_sha: str
    profile: str
    rules_hash: str
    request_id: str
    attempt: int = 1
    exclude_runners: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.pr, bool) or not isinstance(self.pr, int) or self.pr <= 0:
            raise ValueError(f"pr must be a positive int, got {self.pr!r}")
        for name in ("head_sha", "base_sha"):
            if not _GIT_SHA.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} must be a full 40-hex git sha, got {getattr(self, name)!r}")
        if not _REQUEST_ID.fullmatch(self.request_id):
            raise ValueError(f"request_id must be 8-100 of [a-z0-9-], got {self.request_id!r}")
        if self.attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {self.attempt}")
        for name in self.exclude_runners:
            if not _RUNNER_NAME.fullmatch(name):
                raise ValueError(f"runner name {name!r} cannot go in a comma-separated list")

    @property
    def artifact_name(self) -> str:
        """The artifact the run must upload."""
        return ARTIFACT_PREFIX + self.request_id


def new_request(
    pr: int,
    head_sha: str,
    base_sha: str,
    profile: str,
    rules: Rules,
    attempt: int = 1,
    exclude_runners: tuple[str, ...] = (),
) -> DispatchRequest:
    """A request with a fresh request id (unique per attempt, so a late run of an old attempt is ignored)."""
    request_id = f"evalbot-{pr}-{head_sha[:12]}-{attempt}-{secrets.token_hex(4)}"
    return DispatchRequest(
        pr, head_sha, base_sha, profile, rules.rules_hash, request_id, attempt, exclude_runners
    )


@dataclass(frozen=True)
class DispatchHandle:
    """A dispatched request: where it went, when it must be done by, and its run once known."""

    request: DispatchRequest
    workflow: str
    ref: str
    dispatched_at: datetime
    deadline: datetime
    run_id: int | None = None
    runner_name: str | None = None
    html_url: str = ""


@dataclass(frozen=True)
class Pending:
    """Still queued or running (or not yet found); ``handle`` may have learnt its run id: save it."""

    handle: DispatchHandle
    note: str = ""


@dataclass(frozen=True)
class Finished:
    """The run's artifact verified: a judgement the bot may publish."""

    handle: DispatchHandle
    judgement: Judgement


@dataclass(frozen=True)
class Failed:
    """No verdict from this attempt. ``retry``: worth a run elsewhere; ``alert``: a maintainer must look."""

    handle: DispatchHandle
    reason: str
    infra: bool = True
    retry: bool = False
    alert: bool = False
    retried_as: DispatchHandle | None = None  # set by advance() once it dispatched the retry


Outcome = Pending | Finished | Failed


class ArtifactProblem(Exception):
    """The run's artifact cannot be believed; ``alert`` when it looks forged or misdirected."""

    def __init__(self, reason: str, *, alert: bool = False, retry: bool = False):
        super().__init__(reason)
        self.reason, self.alert, self.retry = reason, alert, retry


# ---------------------------------------------------------------- pure decisions


def workflow_inputs(req: DispatchRequest) -> dict[str, str]:
    """The workflow_dispatch inputs for a request (GitHub takes strings only)."""
    return {
        "pr": str(req.pr),
        "head_sha": req.head_sha,
        "base_sha": req.base_sha,
        "profile": req.profile,
        "request_id": req.request_id,
        "exclude_runner": ",".join(req.exclude_runners),
    }


def names_request(run: WorkflowRun, request_id: str) -> bool:
    """Whether a run is the one dispatched for request_id (its run-name carries the id as a word)."""
    return run.event == "workflow_dispatch" and request_id in run.display_title.split()


def retry_request(failed: Failed, rules: Rules) -> DispatchRequest:
    """The next attempt after a failed one: a fresh id, and the failed run's runner excluded if known."""
    req = failed.handle.request
    runner = failed.handle.runner_name
    exclude = req.exclude_runners + ((runner,) if runner and runner not in req.exclude_runners else ())
    return new_request(req.pr, req.head_sha, req.base_sha, req.profile, rules, req.attempt + 1, exclude)


def infra_verdict(rules: Rules, reason: str) -> Verdict:
    """The INFRA_ERROR verdict recorded for an evaluation that produced no believable result."""
    infra = rules.labels.infra_error
    remove = tuple(sorted(verdict.verdict_labels(rules) - {infra}))
    return Verdict(
        Status.INFRA_ERROR, None, None, (), (reason,), (infra,), remove, rules_hash=rules.rules_hash
    )


def trust_problem(receipt: Any, public_keys: tuple[str, ...]) -> str | None:
    """Why the receipt is not signed by one of the runner keys, or None when it is."""
    if not public_keys:
        return "no runner keys are listed in rules/dispatch.yaml: no remote result can be trusted"
    reasons = []
    for key in public_keys:
        result = receipts.verify(receipt, key)
        if result.ok:
            return None
        reasons.append(result.reason)
    if all(r == "signed by a different key" for r in reasons):
        status = receipts.signature_status(receipt)
        return f"receipt {status}, which is none of the runner keys in rules/dispatch.yaml"
    # a reason that does not depend on the key (unsigned, tampered with the right key, malformed)
    return next(r for r in reasons if r != "signed by a different key")


def check_artifact(
    receipt: Mapping[str, Any], result: Mapping[str, Any], req: DispatchRequest, rules: Rules
) -> Judgement:
    """The judgement in a run's receipt and result.json, once it is shown to be signed, about this
    request, and consistent; ArtifactProblem otherwise."""
    why = trust_problem(receipt, rules.dispatch.runner_public_keys)
    if why is not None:
        raise ArtifactProblem(f"receipt not trusted: {why}", alert=True)
    body = receipt["body"]
    if body.get("schema") != receipts.SCHEMA:
        raise ArtifactProblem(
            f"receipt schema is {body.get('schema')!r}, not {receipts.SCHEMA!r}", alert=True
        )
    if "incomplete" in body:
        # the runner stopped before it knew the revisions: nothing in it is bound to this request
        raise ArtifactProblem(f"receipt is incomplete: {body['incomplete']}")
    _check_binding(body, req)
    if body.get("rules_hash") != req.rules_hash:
        raise ArtifactProblem(
            f"receipt was made under rules {str(body.get('rules_hash'))[:12]}, not the requested "
            f"{req.rules_hash[:12]} (main's rules changed under the run?)",
            retry=True,
        )
    if rules.rules_hash != req.rules_hash:
        raise ArtifactProblem(
            f"the bot's rules are now {rules.rules_hash[:12]}, not {req.rules_hash[:12]} as dispatched: "
            "the verdict cannot be checked against the rules it was made under"
        )
    for part in ("measurements", "verdict"):
        if result.get(part) != body.get(part):
            raise ArtifactProblem(f"result.json's {part} differ from the signed receipt's", alert=True)
    try:
        m = from_dict(Measurements, body["measurements"])
        v = from_dict(Verdict, body["verdict"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactProblem(
            f"signed receipt does not hold this bot's Measurements/Verdict: {exc}"
        ) from None
    p = m.provenance
    asked = (req.head_sha, req.base_sha, req.rules_hash, req.profile)
    if (p.head_sha, p.base_sha, p.rules_hash, p.profile) != asked:
        raise ArtifactProblem(
            f"measurements were taken of head {p.head_sha[:12]} vs base {p.base_sha[:12]} with profile "
            f"{p.profile!r}, not what was requested",
            alert=True,
        )
    if p.pr not in (None, req.pr):
        raise ArtifactProblem(f"measurements name PR #{p.pr}, not #{req.pr}", alert=True)
    derived = verdict.decide(m, rules)
    if derived != v:
        raise ArtifactProblem(
            f"signed verdict ({_short(v)}) does not follow from its measurements under these rules "
            f"(they give {_short(derived)})",
            alert=True,
        )
    return Judgement(m, v, dict(receipt))


def _check_binding(body: Mapping[str, Any], req: DispatchRequest) -> None:
    for name in ("head_sha", "base_sha"):
        if body.get(name) != getattr(req, name):
            raise ArtifactProblem(
                f"receipt is for {name} {str(body.get(name))[:12]}, not the requested "
                f"{getattr(req, name)[:12]}",
                alert=True,
            )
    # `evalbot evaluate` leaves pr unset (None); a receipt naming a PR must name this one.
    if body.get("pr") not in (None, req.pr):
        raise ArtifactProblem(f"receipt is for PR #{body.get('pr')}, not #{req.pr}", alert=True)
    extra = body.get("extra")
    if isinstance(extra, Mapping) and "request_id" in extra and extra["request_id"] != req.request_id:
        raise ArtifactProblem(
            f"receipt answers request {extra['request_id']!r}, not {req.request_id!r}", alert=True
        )


def _short(v: Verdict) -> str:
    return f"{v.status.value}{' ' + v.tier if v.tier else ''}"


# ---------------------------------------------------------------- I/O over the port


def dispatch(gh: GitHubPort, rules: Rules, req: DispatchRequest, now: datetime) -> DispatchHandle:
    """Dispatch the workflow for req; GitHubError when GitHub refuses (no run was started).

    When GitHub stays unavailable the run may or may not exist: the handle then has no run id, and
    poll() looks for the request id among the runs until DISCOVERY_S has passed.
    """
    d = rules.dispatch
    handle = DispatchHandle(req, d.workflow, d.ref, now, now + timedelta(minutes=d.timeout_minutes))
    try:
        run_id = gh.dispatch_workflow(d.workflow, d.ref, workflow_inputs(req))
    except GitHubUnavailable:
        return handle
    return replace(handle, run_id=run_id)


def poll(
    gh: GitHubPort,
    rules: Rules,
    handle: DispatchHandle,
    now: datetime,
    workdir: Path,
    runner_of: RunnerLookup | None = None,
) -> Outcome:
    """Where one dispatched run stands: Pending, Finished with a verified judgement, or Failed."""
    try:
        if handle.run_id is None:
            found = find_run(gh, handle)
            if found is None:
                if now >= min(handle.dispatched_at + timedelta(seconds=DISCOVERY_S), handle.deadline):
                    return _failed(
                        rules,
                        handle,
                        f"no run carrying request id {handle.request.request_id} appeared within "
                        f"{(now - handle.dispatched_at).total_seconds() / 60:.0f} minutes of the dispatch",
                    )
                return Pending(handle, "dispatched; its run is not listed yet")
            run = found
            handle = replace(handle, run_id=run.id, html_url=run.html_url)
        else:
            run = gh.get_workflow_run(handle.run_id)
            if run.html_url and not handle.html_url:
                handle = replace(handle, html_url=run.html_url)
        if run.status != "completed":
            if now >= handle.deadline:
                handle = _with_runner(handle, runner_of)
                minutes = (now - handle.dispatched_at).total_seconds() / 60
                cancelled = _cancel(gh, run.id)
                return _failed(rules, handle, f"run {run.id} still {run.status} after {minutes:.0f} minutes"
                               f"{cancelled}")
            return Pending(handle, f"run {run.id} {run.status}")
        if run.conclusion not in _READABLE:
            handle = _with_runner(handle, runner_of)
            return _failed(rules, handle, f"run {run.id} ended {run.conclusion or 'without a conclusion'}")
        try:
            judgement = collect(gh, rules, handle, run, workdir)
        except ArtifactProblem as problem:
            if problem.retry:
                handle = _with_runner(handle, runner_of)
            return _failed(rules, handle, problem.reason, retry=problem.retry, alert=problem.alert)
        return Finished(handle, judgement)
    except GitHubUnavailable as exc:
        if now >= handle.deadline:
            return _failed(rules, handle, f"GitHub unavailable past the run's deadline: {exc}")
        return Pending(handle, f"GitHub unavailable, will look again: {exc}")
    except GitHubError as exc:  # e.g. the run was deleted: this attempt has nothing more to give
        return _failed(rules, handle, f"run {handle.run_id} cannot be read: {exc}")


def _cancel(gh: GitHubPort, run_id: int) -> str:
    """Cancel a run past its deadline, so it stops holding its runner (and never reports late); what
    happened, for the failure's reason. GitHub refuses a run that completed meanwhile: then it is done."""
    try:
        gh.cancel_workflow_run(run_id)
    except GitHubError as exc:
        return f" (cancelling it failed: {str(exc)[:160]})"
    return ", cancelled"


def find_run(gh: GitHubPort, handle: DispatchHandle) -> WorkflowRun | None:
    """The run whose run-name carries the handle's request id, among the workflow's newest runs."""
    runs = gh.list_workflow_runs(handle.workflow, limit=RUN_LIST_LIMIT)
    return next((r for r in runs if names_request(r, handle.request.request_id)), None)


def collect(gh: GitHubPort, rules: Rules, handle: DispatchHandle, run: WorkflowRun, dest: Path) -> Judgement:
    """Download the run's result artifact into dest, verify it against the request and the runner keys,
    and return its judgement; ArtifactProblem when it cannot be believed."""
    req = handle.request
    wanted = [a for a in gh.list_run_artifacts(run.id) if a.name == req.artifact_name]
    if not wanted:
        raise ArtifactProblem(
            f"run {run.id} ({run.conclusion}) uploaded no artifact {req.artifact_name}", retry=True
        )
    if len(wanted) > 1:
        raise ArtifactProblem(
            f"run {run.id} uploaded {len(wanted)} artifacts named {req.artifact_name}", alert=True
        )
    artifact = wanted[0]
    if artifact.expired:
        raise ArtifactProblem(f"artifact {artifact.name} of run {run.id} has expired", retry=True)
    scratch = Path(dest) / req.request_id
    try:
        try:
            folder = gh.download_artifact(artifact.id, scratch)
        except ArtifactRejected as exc:
            # an honest upload is a plain zip of three files: this one was made by hand
            raise ArtifactProblem(f"artifact {artifact.name} rejected: {exc}", alert=True) from None
        except GitHubUnavailable:
            raise
        except GitHubError as exc:
            raise ArtifactProblem(
                f"artifact {artifact.name} could not be downloaded: {exc}", retry=True
            ) from None
        receipt = _read_json(folder, RECEIPT_FILE)
        result = _read_json(folder, RESULT_FILE)
        return check_artifact(receipt, result, req, rules)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read_json(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    if not path.is_file() or path.is_symlink():
        raise ArtifactProblem(f"artifact holds no {name}", retry=True)
    try:
        # strict: duplicate keys or NaN would let two readers see two different documents
        return receipts.load(path)
    except receipts.ReceiptError as exc:
        raise ArtifactProblem(f"{name} is unreadable: {exc}", retry=True) from None


def _with_runner(handle: DispatchHandle, runner_of: RunnerLookup | None) -> DispatchHandle:
    if runner_of is None or handle.run_id is None or handle.runner_name:
        return handle
    try:
        name = runner_of(handle.run_id)
    except GitHubError:  # the runner is a hint for the retry; not knowing it is no reason to stop
        return handle
    return replace(handle, runner_name=name) if name and _RUNNER_NAME.fullmatch(name) else handle


def _failed(
    rules: Rules, handle: DispatchHandle, reason: str, *, retry: bool = True, alert: bool = False
) -> Failed:
    attempt, limit = handle.request.attempt, rules.dispatch.max_attempts
    where = f" on runner {handle.runner_name}" if handle.runner_name else ""
    if retry and attempt >= limit:
        return Failed(handle, f"{reason}{where} (attempt {attempt} of {limit}: no retries left)", alert=alert)
    return Failed(handle, f"{reason}{where} (attempt {attempt} of {limit})", retry=retry, alert=alert)


# ---------------------------------------------------------------- persistence

_OPEN_STATES = ("dispatching", "in_flight")


@dataclass(frozen=True)
class DispatchRecord:
    """One row of dispatch_runs: a handle, its state and what became of it."""

    handle: DispatchHandle
    state: str  # dispatching, in_flight, finished, failed, retried
    note: str
    retried_as: str | None


class DispatchRuns:
    """Dispatch handles in the store's file (``Store.open_connection()``), so a restart resumes them."""

    def __init__(self, conn: sqlite3.Connection):
        require_tables(conn, ("dispatch_runs",), "dispatch handles")  # the store's migrations make it
        self.conn = conn

    def save(self, handle: DispatchHandle, state: str = "in_flight", note: str = "") -> None:
        """Insert or update an open handle; 'dispatching' is written before the GitHub call."""
        if state not in _OPEN_STATES:
            raise ValueError(f"save() keeps open handles ({', '.join(_OPEN_STATES)}); close() ends {state!r}")
        values = {**_row(handle), "state": state, "note": note, "updated_at": times.stamp()}
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        learnt = ", ".join(f"{c} = excluded.{c}" for c in _LEARNT)
        with self.conn:
            # a closed row is never reopened: a late save of a stale handle changes nothing
            self.conn.execute(
                f"INSERT INTO dispatch_runs ({names}) VALUES ({marks}) ON CONFLICT (request_id) DO UPDATE "
                f"SET {learnt} WHERE dispatch_runs.state IN ('dispatching', 'in_flight')",
                tuple(values.values()),
            )

    def close(
        self, handle: DispatchHandle, state: str, note: str = "", retried_as: str | None = None
    ) -> None:
        """Mark a handle finished, failed or retried (as request ``retried_as``), keeping what was learnt."""
        if state not in ("finished", "failed", "retried"):
            raise ValueError(f"close() state must be finished, failed or retried, got {state!r}")
        run_id, runner, at = handle.run_id, handle.runner_name, times.stamp()
        with self.conn:
            self.conn.execute(
                "UPDATE dispatch_runs SET state = ?, note = ?, retried_as = ?, run_id = coalesce(?, run_id), "
                "runner_name = coalesce(?, runner_name), updated_at = ? WHERE request_id = ?",
                (state, note, retried_as, run_id, runner, at, handle.request.request_id),
            )

    def in_flight(self) -> list[DispatchHandle]:
        """Handles not yet finished, failed or retried, oldest dispatch first."""
        return [r.handle for r in self._select("state IN ('dispatching', 'in_flight')", ())]

    def history(self, pr: int, head_sha: str, base_sha: str, rules_hash: str) -> list[DispatchRecord]:
        """Every attempt at one evaluation, first attempt first."""
        where = "pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?"
        return self._select(where, (pr, head_sha, base_sha, rules_hash))

    def record(self, request_id: str) -> DispatchRecord | None:
        """One attempt by its request id."""
        found = self._select("request_id = ?", (request_id,))
        return found[0] if found else None

    def _select(self, where: str, args: tuple[Any, ...]) -> list[DispatchRecord]:
        cur = self.conn.execute(
            f"SELECT * FROM dispatch_runs WHERE {where} ORDER BY dispatched_at, attempt, request_id", args
        )
        names = [c[0] for c in cur.description]
        return [_record(dict(zip(names, row, strict=True))) for row in cur.fetchall()]


# columns that poll() may learn about an open handle
_LEARNT = ("run_id", "runner_name", "html_url", "state", "note", "updated_at")


def _row(handle: DispatchHandle) -> dict[str, Any]:
    r = handle.request
    return {
        "request_id": r.request_id, "pr": r.pr, "head_sha": r.head_sha, "base_sha": r.base_sha,
        "rules_hash": r.rules_hash, "profile": r.profile, "attempt": r.attempt,
        "exclude_runners": json.dumps(list(r.exclude_runners)), "workflow": handle.workflow,
        "ref": handle.ref, "dispatched_at": times.stamp(handle.dispatched_at), "deadline": times.stamp(handle.deadline),
        "run_id": handle.run_id, "runner_name": handle.runner_name, "html_url": handle.html_url,
    }  # fmt: skip


def _record(d: dict[str, Any]) -> DispatchRecord:
    req = DispatchRequest(
        d["pr"], d["head_sha"], d["base_sha"], d["profile"], d["rules_hash"], d["request_id"], d["attempt"],
        tuple(json.loads(d["exclude_runners"])),
    )  # fmt: skip
    handle = DispatchHandle(
        req, d["workflow"], d["ref"], times.parse(d["dispatched_at"]),
        times.parse(d["deadline"]), d["run_id"], d["runner_name"], d["html_url"],
    )  # fmt: skip
    return DispatchRecord(handle, d["state"], d["note"], d["retried_as"])


# ---------------------------------------------------------------- the poller's two entry points


def start(gh: GitHubPort, rules: Rules, runs: DispatchRuns, req: DispatchRequest, now: datetime) -> Outcome:
    """Record the request, dispatch it and record the run id: Pending, or Failed when GitHub refuses."""
    d = rules.dispatch
    intent = DispatchHandle(req, d.workflow, d.ref, now, now + timedelta(minutes=d.timeout_minutes))
    runs.save(intent, "dispatching")  # before the call: a crash after it still leaves a handle to find
    try:
        handle = dispatch(gh, rules, req, now)
    except GitHubError as exc:
        # a refusal (no such workflow or ref, bad inputs) is the deployment's fault and repeats on retry
        failed = Failed(intent, f"dispatch of {d.workflow}@{d.ref} refused: {exc}", alert=True)
        runs.close(intent, "failed", failed.reason)
        return failed
    runs.save(handle, "in_flight", "" if handle.run_id else "dispatched; run id not returned")
    return Pending(handle)


def advance(
    gh: GitHubPort,
    rules: Rules,
    runs: DispatchRuns,
    handle: DispatchHandle,
    now: datetime,
    workdir: Path,
    runner_of: RunnerLookup | None = None,
) -> Outcome:
    """Poll one in-flight handle, record what changed, and dispatch the retry of a failed attempt.

    A verified INFRA_ERROR verdict (the box's fault) is retried elsewhere too while attempts remain.
    Returned: Pending (nothing to publish yet), Finished (publish its judgement), or Failed; a Failed
    with ``retried_as`` set needs nothing from the caller, and one without is final (record
    ``infra_verdict``, and alert a maintainer when ``alert``).
    """
    outcome = poll(gh, rules, handle, now, workdir, runner_of)
    if isinstance(outcome, Pending):
        runs.save(outcome.handle, "in_flight", outcome.note)
        return outcome
    if isinstance(outcome, Finished):
        v = outcome.judgement.verdict
        if v.status is Status.INFRA_ERROR:
            retried = _failed(
                rules, _with_runner(outcome.handle, runner_of), "; ".join(v.reasons) or "INFRA_ERROR"
            )
            if retried.retry:
                outcome = retried
        if isinstance(outcome, Finished):
            runs.close(outcome.handle, "finished", _short(v))
            return outcome
    if not outcome.retry:
        runs.close(outcome.handle, "failed", outcome.reason)
        return outcome
    nxt = start(gh, rules, runs, retry_request(outcome, rules), now)
    if isinstance(nxt, Failed):  # the retry could not even be dispatched: this evaluation ends here
        runs.close(outcome.handle, "failed", outcome.reason)
        return Failed(outcome.handle, f"{outcome.reason}; retry not dispatched: {nxt.reason}", alert=True)
    runs.close(outcome.handle, "retried", outcome.reason, nxt.handle.request.request_id)
    return replace(outcome, retried_as=nxt.handle)
