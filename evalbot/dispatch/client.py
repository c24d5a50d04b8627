"""Dispatch's I/O half: dispatch a run over the GitHub port, follow it, collect and check its artifact
(through ``evalbot.dispatch.checks``), keep each handle in the store (``store.dispatches``), and the
poller's two entry points ``start`` and ``advance``."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from evalbot import receipts
from evalbot.dispatch.checks import (
    DISCOVERY_S,
    READABLE_CONCLUSIONS,
    RECEIPT_FILE,
    RESULT_FILE,
    RUN_LIST_LIMIT,
    RUNNER_NAME,
    ArtifactProblem,
    DispatchHandle,
    DispatchRequest,
    Failed,
    Finished,
    Outcome,
    Pending,
    RunnerLookup,
    check_artifact,
    names_request,
    retry_request,
    short_verdict,
    workflow_inputs,
)
from evalbot.github import ArtifactRejected, GitHubError, GitHubPort, GitHubUnavailable
from evalbot.judge import Judgement
from evalbot.model import Status, WorkflowRun
from evalbot.rules import Rules
from evalbot.store import Dispatches, DispatchRow

# ---------------------------------------------------------------- I/O over the port


def _intent(rules: Rules, req: DispatchRequest, now: datetime) -> DispatchHandle:
    """The handle of req dispatched now under the rules' workflow, ref and timeout; no run yet."""
    d = rules.dispatch
    return DispatchHandle(
        req,
        workflow=d.workflow,
        ref=d.ref,
        dispatched_at=now,
        deadline=now + timedelta(minutes=d.timeout_minutes),
    )


def dispatch(gh: GitHubPort, rules: Rules, req: DispatchRequest, now: datetime) -> DispatchHandle:
    """Dispatch the workflow for req; GitHubError when GitHub refuses (no run was started).

    When GitHub stays unavailable the run may or may not exist: the handle then has no run id, and
    poll() looks for the request id among the runs until DISCOVERY_S has passed.
    """
    d = rules.dispatch
    handle = _intent(rules, req, now)
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
                return _failed(
                    rules, handle, f"run {run.id} still {run.status} after {minutes:.0f} minutes{cancelled}"
                )
            return Pending(handle, f"run {run.id} {run.status}")
        if run.conclusion not in READABLE_CONCLUSIONS:
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


def runner_of(gh: GitHubPort, run_id: int) -> str | None:
    """The runner a run's job landed on (the poller's ``RunnerLookup``), or None before a runner took it."""
    return next((j["runner_name"] for j in gh.list_run_jobs(run_id) if j.get("runner_name")), None)


def _with_runner(handle: DispatchHandle, runner_of: RunnerLookup | None) -> DispatchHandle:
    if runner_of is None or handle.run_id is None or handle.runner_name:
        return handle
    try:
        name = runner_of(handle.run_id)
    except GitHubError:  # the runner is a hint for the retry; not knowing it is no reason to stop
        return handle
    return replace(handle, runner_name=name) if name and RUNNER_NAME.fullmatch(name) else handle


def _failed(
    rules: Rules, handle: DispatchHandle, reason: str, *, retry: bool = True, alert: bool = False
) -> Failed:
    attempt, limit = handle.request.attempt, rules.dispatch.max_attempts
    where = f" on runner {handle.runner_name}" if handle.runner_name else ""
    if retry and attempt >= limit:
        return Failed(handle, f"{reason}{where} (attempt {attempt} of {limit}: no retries left)", alert=alert)
    return Failed(handle, f"{reason}{where} (attempt {attempt} of {limit})", retry=retry, alert=alert)


# ---------------------------------------------------------------- persistence


@dataclass(frozen=True)
class DispatchRecord:
    """One attempt as the store keeps it: a handle, its state and what became of it."""

    handle: DispatchHandle
    state: str  # dispatching, in_flight, finished, failed, retried
    note: str
    retried_as: str | None


class DispatchRuns:
    """Dispatch handles kept in the store (``store.dispatches``), so a restart resumes them."""

    def __init__(self, rows: Dispatches):
        self.rows = rows

    def save(self, handle: DispatchHandle, state: str = "in_flight", note: str = "") -> None:
        """Insert or update an open handle; 'dispatching' is written before the GitHub call."""
        self.rows.save(replace(_row(handle), state=state, note=note))

    def close(
        self, handle: DispatchHandle, state: str, note: str = "", retried_as: str | None = None
    ) -> None:
        """Mark a handle finished, failed or retried (as request ``retried_as``), keeping what was learnt."""
        self.rows.close(replace(_row(handle), state=state, note=note, retried_as=retried_as))

    def in_flight(self) -> list[DispatchHandle]:
        """Handles not yet finished, failed or retried, oldest dispatch first."""
        return [_record(r).handle for r in self.rows.open()]

    def history(self, pr: int, head_sha: str, base_sha: str, rules_hash: str) -> list[DispatchRecord]:
        """Every attempt at one evaluation, first attempt first."""
        return [_record(r) for r in self.rows.history(pr, head_sha, base_sha, rules_hash)]

    def record(self, request_id: str) -> DispatchRecord | None:
        """One attempt by its request id."""
        found = self.rows.get(request_id)
        return None if found is None else _record(found)


def _row(handle: DispatchHandle) -> DispatchRow:
    r = handle.request
    return DispatchRow(
        r.request_id, r.pr, r.head_sha, r.base_sha, r.rules_hash, r.profile, r.attempt, r.exclude_runners,
        **handle.placement(),
    )  # fmt: skip


def _record(row: DispatchRow) -> DispatchRecord:
    req = DispatchRequest(row.pr, row.head_sha, row.base_sha, row.profile, row.rules_hash, row.request_id,
                          row.attempt, row.exclude_runners)  # fmt: skip
    return DispatchRecord(DispatchHandle(req, **row.placement()), row.state, row.note, row.retried_as)


# ---------------------------------------------------------------- the poller's two entry points


def start(gh: GitHubPort, rules: Rules, runs: DispatchRuns, req: DispatchRequest, now: datetime) -> Outcome:
    """Record the request, dispatch it and record the run id: Pending, or Failed when GitHub refuses."""
    d = rules.dispatch
    intent = _intent(rules, req, now)
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
            runs.close(outcome.handle, "finished", short_verdict(v))
            return outcome
    if not outcome.retry:
        runs.close(outcome.handle, "failed", outcome.reason)
        return outcome
    nxt = start(gh, rules, runs, retry_request(outcome), now)
    if isinstance(nxt, Failed):  # the retry could not even be dispatched: this evaluation ends here
        runs.close(outcome.handle, "failed", outcome.reason)
        return Failed(outcome.handle, f"{outcome.reason}; retry not dispatched: {nxt.reason}", alert=True)
    runs.close(outcome.handle, "retried", outcome.reason, nxt.handle.request.request_id)
    return replace(outcome, retried_as=nxt.handle)


__all__ = [
    "DispatchRecord",
    "DispatchRuns",
    "advance",
    "collect",
    "dispatch",
    "find_run",
    "poll",
    "runner_of",
    "start",
]
