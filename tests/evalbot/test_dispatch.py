"""Evaluations on self-hosted Actions runners, against the GitHub double: the test plays the runner.

Dispatch -> the run is found -> the runner uploads a genuinely signed artifact -> poll -> collect ->
a verified judgement; and every way an attempt can fail: a failed or never-ending run (INFRA_ERROR,
retried elsewhere), and artifacts that must never be published (unknown key, tampering, another head,
an unearned tier, a path-traversal zip), each with an alert. Handles survive a restart.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from evalbot import dispatch, judge, receipts
from evalbot.codec import to_dict
from evalbot.dispatch import (
    ArtifactProblem,
    DispatchRuns,
    Failed,
    Finished,
    Pending,
    advance,
    check_artifact,
    new_request,
    start,
)
from evalbot.github import PyGithubAdapter
from evalbot.github_retry import RetryPolicy
from evalbot.model import (
    AccuracyResult,
    EvalRequest,
    Failure,
    Measurements,
    Provenance,
    Side,
    Status,
    ThroughputPairs,
)
from evalbot.rules import default_rules_dir, load_rules, rules_hash
from evalbot.store import Store
from evalbot.verdict.decide import decide
from tests.github_double.serve import Double, FakeClock
from tests.github_double.state import Fault, zip_bytes

pytest_plugins = ["tests.github_double.fixture"]  # github_double, fake_clock

WORKFLOW = "evalbot-eval.yml"
RUN_NAME = "evalbot #${{ inputs.pr }} ${{ inputs.request_id }}"
PR, HEAD, BASE = 7, "b" * 40, "a" * 40
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MODEL = "qwen2.5-coder-0.5b"
RUNNER_KEY = receipts.generate_key()
ROGUE_KEY = receipts.generate_key()


def public_b64(key) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def rules():
    base = load_rules(default_rules_dir())
    d = replace(base.dispatch, mode="actions", runner_public_keys=(public_b64(RUNNER_KEY),))
    actions = replace(base, dispatch=d)
    return replace(actions, rules_hash=rules_hash(actions))


@pytest.fixture
def gh(github_double: Double, fake_clock: FakeClock) -> PyGithubAdapter:
    s = github_double.state
    s.add_workflow(WORKFLOW, run_name=RUN_NAME)
    s.add_pull(PR, head_sha=HEAD, base_sha=BASE)
    return PyGithubAdapter.from_token(
        github_double.repo,
        "ghp_test_token",
        base_url=github_double.base_url,
        pace=False,
        timeout=0.5,
        sleep=fake_clock.sleep,
        clock=fake_clock.time,
        rng=random.Random(0),
        policy=RetryPolicy(attempts=2),
    )


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "bot.sqlite") as s:
        yield s


@pytest.fixture
def runs(store):
    return DispatchRuns(store.dispatches)


@pytest.fixture
def workdir(tmp_path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def jobs_runner(gh: PyGithubAdapter):
    """The poller's RunnerLookup: the runner a run's job landed on, read through the port's list_run_jobs."""
    return partial(dispatch.runner_of, gh)


# --- the runner's side -----------------------------------------------------------------------------------


def pairs(ratio: float, n: int = 12, seed: int = 0) -> tuple[tuple[float, float], ...]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        drift = 100 * (1 + 0.01 * i)
        out.append((drift * (1 + rng.gauss(0, 0.004)), drift * ratio * (1 + rng.gauss(0, 0.004))))
    return tuple(out)


def measurements(
    rules, *, head: str = HEAD, base: str = BASE, pr: int | None = PR, gain: float = 1.05, failures=()
) -> Measurements:
    prov = Provenance(
        repo=".", base_sha=base, head_sha=head, harness_sha=base, rules_hash=rules.rules_hash, profile="cpu",
        model_sha256s={MODEL: "1" * 64}, engine_build={"python": "3.12"}, box={"runner": "box"},
        started_at="2026-12-01T12:05:00Z", finished_at="2026-12-01T12:40:00Z", pr=pr,
    )  # fmt: skip
    return Measurements(
        prov,
        throughput=(
            ThroughputPairs(MODEL, 128, "decode_tps", pairs(1.0, seed=128)),
            ThroughputPairs(MODEL, 512, "decode_tps", pairs(gain, seed=512)),
        ),
        accuracy=(AccuracyResult(MODEL, 512, 0.99, 0.001, 1.0005),),
        failures=tuple(failures),
    )


def artifact_files(rules, key=RUNNER_KEY, m: Measurements | None = None, verdict=None) -> dict[str, bytes]:
    """What `evalbot evaluate --out out --key K` writes, made by the same judge.receipt the runner uses."""
    m = m or measurements(rules)
    v = verdict or decide(m, rules)
    receipt = judge.receipt(m, v, key)
    result = {"measurements": to_dict(m), "verdict": to_dict(v), "signature_status": "signed"}
    return {
        "result.json": json.dumps(result, indent=2).encode(),
        "receipt.json": json.dumps(receipt, indent=2).encode(),
        "report.md": b"# report\n",
    }


def play_runner(double: Double, run_id: int, files: dict[str, bytes] | None, *, box: str = "box-1",
                conclusion: str = "success") -> None:  # fmt: skip
    """A self-hosted runner takes the run, then finishes it, uploading ``files`` under the requested name."""
    s = double.state
    s.pick_up_run(run_id, box)
    request_id = s.runs[run_id].inputs["request_id"]
    s.complete_run(run_id, conclusion, {f"evalbot-result-{request_id}": files} if files is not None else None)


def ask(
    rules, profile: str = "cpu", pr: int = PR, head: str = HEAD, base: str = BASE
) -> dispatch.DispatchRequest:
    """The dispatch of one evaluation request, as the poller makes it."""
    return new_request(EvalRequest(base, head, head, rules.rules_hash, rules.profile(profile), pr=pr))


def begin(gh, rules, runs) -> dispatch.DispatchHandle:
    outcome = start(gh, rules, runs, ask(rules), T0)
    assert isinstance(outcome, Pending)
    return outcome.handle


# --- the round trip ----------------------------------------------------------------------------------------


def test_dispatch_run_collect_gives_the_verified_judgement(github_double, gh, rules, runs, workdir):
    s = github_double.state
    handle = begin(gh, rules, runs)
    (call,) = s.calls("workflows.dispatch")
    req = handle.request
    assert call.body == {
        "ref": "main",
        "inputs": {"pr": "7", "head_sha": HEAD, "base_sha": BASE, "profile": "cpu",
                   "request_id": req.request_id, "exclude_runner": ""},
        "return_run_details": True,
    }  # fmt: skip
    assert handle.run_id is not None and s.runs[handle.run_id].display_title == f"evalbot #7 {req.request_id}"
    assert handle.deadline == T0 + timedelta(minutes=rules.dispatch.timeout_minutes)
    assert [h.request.request_id for h in runs.in_flight()] == [req.request_id]

    queued = advance(gh, rules, runs, handle, T0 + timedelta(minutes=1), workdir)
    assert isinstance(queued, Pending) and queued.note == f"run {handle.run_id} queued"
    s.pick_up_run(handle.run_id, "box-1")
    assert advance(gh, rules, runs, handle, T0 + timedelta(minutes=2), workdir).note.endswith("in_progress")

    s.complete_run(handle.run_id, "success", {req.artifact_name: artifact_files(rules)})
    done = advance(gh, rules, runs, handle, T0 + timedelta(minutes=40), workdir)

    assert isinstance(done, Finished)
    j = done.judgement
    assert (j.verdict.status, j.verdict.tier, j.verdict.scored_context) == (Status.PASS, "S", 512)
    assert j.measurements == measurements(rules)
    assert receipts.verify(j.receipt, public_b64(RUNNER_KEY)).ok
    assert j.signature_status == f"signed by {receipts.default_key_id(RUNNER_KEY.public_key())}"
    assert runs.in_flight() == []
    record = runs.record(req.request_id)
    assert (record.state, record.note, record.handle.run_id) == ("finished", "PASS S", handle.run_id)
    assert list(workdir.iterdir()) == []  # the download is not left behind
    assert len(s.calls("workflows.dispatch")) == 1


def test_a_dispatch_answered_204_finds_its_run_by_the_request_id(github_double, gh, rules, runs, workdir):
    s = github_double.state
    s.run_details_supported = False
    decoy = s.start_run(WORKFLOW, "main", {"pr": "7", "request_id": "evalbot-7-other-1-00000000"})
    handle = begin(gh, rules, runs)
    assert handle.run_id is None
    s.start_run(WORKFLOW, "main", {"pr": "8", "request_id": "evalbot-8-later-1-11111111"})  # a newer run

    found = advance(gh, rules, runs, handle, T0 + timedelta(minutes=1), workdir)

    assert isinstance(found, Pending) and found.handle.run_id not in (None, decoy.id)
    run = s.runs[found.handle.run_id]
    assert run.inputs["request_id"] == handle.request.request_id
    assert runs.in_flight() == [found.handle]  # the run id is saved for the next poll and a restart
    play_runner(github_double, run.id, artifact_files(rules))
    assert isinstance(advance(gh, rules, runs, found.handle, T0 + timedelta(minutes=30), workdir), Finished)


def test_a_dispatch_whose_run_never_appears_is_lost_and_retried(github_double, gh, rules, runs, workdir):
    s = github_double.state
    s.run_details_supported = False
    handle = begin(gh, rules, runs)
    s.runs.clear()  # GitHub acted on nothing

    early = advance(gh, rules, runs, handle, T0 + timedelta(minutes=5), workdir)
    assert isinstance(early, Pending) and "not listed yet" in early.note
    lost = advance(gh, rules, runs, handle, T0 + timedelta(seconds=dispatch.DISCOVERY_S), workdir)

    assert isinstance(lost, Failed) and lost.retry and lost.retried_as is not None and not lost.alert
    assert f"no run carrying request id {handle.request.request_id} appeared within 15 minutes" in lost.reason
    assert len(s.calls("workflows.dispatch")) == 2


# --- runs that fail or never finish: INFRA_ERROR and a retry elsewhere ------------------------------------


def test_a_failed_run_is_infra_and_retried_without_its_runner(github_double, gh, rules, runs, workdir):
    s = github_double.state
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, None, box="box-bad", conclusion="failure")

    failed = advance(gh, rules, runs, handle, T0 + timedelta(minutes=20), workdir, jobs_runner(gh))

    assert isinstance(failed, Failed) and failed.infra and failed.retry and not failed.alert
    assert failed.reason == (
        f"run {handle.run_id} (failure) uploaded no artifact {handle.request.artifact_name} "
        "on runner box-bad (attempt 1 of 3)"
    )
    retry = failed.retried_as
    assert retry is not None and retry.request.attempt == 2
    assert retry.request.request_id != handle.request.request_id
    assert retry.request.exclude_runners == ("box-bad",)
    second = s.calls("workflows.dispatch")[1].body["inputs"]
    assert (second["exclude_runner"], second["request_id"]) == ("box-bad", retry.request.request_id)
    first = runs.record(handle.request.request_id)
    assert (first.state, first.retried_as, first.handle.runner_name) == (
        "retried",
        retry.request.request_id,
        "box-bad",
    )
    assert runs.in_flight() == [retry]

    play_runner(github_double, retry.run_id, artifact_files(rules), box="box-2")
    done = advance(gh, rules, runs, retry, T0 + timedelta(minutes=60), workdir, jobs_runner(gh))
    assert isinstance(done, Finished) and done.judgement.verdict.tier == "S"
    history = runs.history(PR, HEAD, BASE, rules.rules_hash)
    assert [(r.handle.request.attempt, r.state) for r in history] == [(1, "retried"), (2, "finished")]


@pytest.mark.parametrize("conclusion", ["cancelled", "timed_out", "startup_failure"])
def test_a_cancelled_or_timed_out_run_is_retried_even_with_an_artifact(
    github_double, gh, rules, runs, workdir, conclusion
):
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, artifact_files(rules), conclusion=conclusion)
    failed = advance(gh, rules, runs, handle, T0 + timedelta(minutes=20), workdir, jobs_runner(gh))
    assert isinstance(failed, Failed) and failed.retry and failed.retried_as is not None
    assert failed.reason == f"run {handle.run_id} ended {conclusion} on runner box-1 (attempt 1 of 3)"
    assert github_double.state.calls("artifacts.zip") == []  # nothing from such a run is read


def test_a_rejected_pr_whose_run_failed_still_gets_its_signed_verdict(
    github_double, gh, rules, runs, workdir
):
    # evaluate exits 1 on a REJECT, so the run's conclusion is failure; the signed receipt decides
    handle = begin(gh, rules, runs)
    slower = measurements(rules, gain=0.9)
    play_runner(github_double, handle.run_id, artifact_files(rules, m=slower), conclusion="failure")
    done = advance(gh, rules, runs, handle, T0 + timedelta(minutes=20), workdir)
    assert isinstance(done, Finished) and done.judgement.verdict.status == Status.REJECT


def test_a_run_that_never_finishes_times_out_then_attempts_run_out(github_double, gh, rules, runs, workdir):
    s = github_double.state
    limit = rules.dispatch.timeout_minutes
    handle = begin(gh, rules, runs)
    s.pick_up_run(handle.run_id, "box-stuck")
    runner_of = jobs_runner(gh)

    assert isinstance(advance(gh, rules, runs, handle, T0 + timedelta(minutes=limit - 1), workdir), Pending)
    late = T0 + timedelta(minutes=limit)
    failed = advance(gh, rules, runs, handle, late, workdir, runner_of)
    assert isinstance(failed, Failed) and failed.retry
    assert (
        failed.reason
        == f"run {handle.run_id} still in_progress after {limit} minutes, cancelled on runner box-stuck (attempt 1 of 3)"
    )
    stuck = s.runs[handle.run_id]  # cancelled on GitHub: it stops holding box-stuck and never reports late
    assert (stuck.status, stuck.conclusion) == ("completed", "cancelled")
    assert [r.path.rsplit("/actions/", 1)[1] for r in s.requests if r.route == "runs.cancel"] == [
        f"runs/{handle.run_id}/cancel"
    ]

    second = failed.retried_as
    assert second is not None and second.deadline == late + timedelta(minutes=limit)
    s.pick_up_run(second.run_id, "box-2")
    s.complete_run(second.run_id, "failure")
    third = advance(gh, rules, runs, second, late + timedelta(minutes=5), workdir, runner_of).retried_as
    assert third is not None and third.request.exclude_runners == ("box-stuck", "box-2")

    final = advance(gh, rules, runs, third, late + timedelta(minutes=5 + limit), workdir, runner_of)
    assert isinstance(final, Failed) and not final.retry and final.retried_as is None and not final.alert
    assert final.reason.endswith("(attempt 3 of 3: no retries left)")
    assert len(s.calls("workflows.dispatch")) == 3 and runs.in_flight() == []
    v = dispatch.infra_verdict(rules, final.reason)
    assert (v.status, v.tier, v.labels_add, v.reasons) == (
        Status.INFRA_ERROR,
        None,
        ("infra-error",),
        (final.reason,),
    )


def test_a_signed_infra_error_is_the_boxs_fault_and_retried_elsewhere(
    github_double, gh, rules, runs, workdir
):
    handle = begin(gh, rules, runs)
    gpu = Failure(Side.HEAD, "gpu", "CUDA error: an illegal memory access")
    files = artifact_files(rules, m=measurements(rules, failures=[gpu]))
    play_runner(github_double, handle.run_id, files, box="box-gpu")
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=20), workdir, jobs_runner(gh))
    assert isinstance(outcome, Failed) and outcome.retry and "CUDA error" in outcome.reason
    assert outcome.retried_as is not None and outcome.retried_as.request.exclude_runners == ("box-gpu",)


# --- artifacts that must never be published ---------------------------------------------------------------


def assert_alert(outcome, runs, github_double, *, contains: str) -> None:
    assert isinstance(outcome, Failed), outcome
    assert outcome.infra and outcome.alert and not outcome.retry and outcome.retried_as is None
    assert contains in outcome.reason, outcome.reason
    assert len(github_double.state.calls("workflows.dispatch")) == 1  # no retry
    assert runs.record(outcome.handle.request.request_id).state == "failed"
    assert runs.in_flight() == []


def test_an_artifact_signed_by_an_unknown_key_raises_an_alert(github_double, gh, rules, runs, workdir):
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, artifact_files(rules, key=ROGUE_KEY))
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    rogue = receipts.default_key_id(ROGUE_KEY.public_key())
    assert_alert(
        outcome, runs, github_double, contains=f"receipt signed by {rogue}, which is none of the runner keys"
    )


def test_an_unsigned_artifact_raises_an_alert(github_double, gh, rules, runs, workdir):
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, artifact_files(rules, key=None))
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(outcome, runs, github_double, contains="receipt not trusted: unsigned")


def test_a_tampered_result_json_raises_an_alert(github_double, gh, rules, runs, workdir):
    handle = begin(gh, rules, runs)
    files = artifact_files(rules)
    result = json.loads(files["result.json"])
    result["verdict"]["tier"] = "XL"
    files["result.json"] = json.dumps(result).encode()
    play_runner(github_double, handle.run_id, files)
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(
        outcome, runs, github_double, contains="result.json's verdict differ from the signed receipt's"
    )


def test_a_tampered_receipt_raises_an_alert(github_double, gh, rules, runs, workdir):
    handle = begin(gh, rules, runs)
    files = artifact_files(rules)
    receipt = json.loads(files["receipt.json"])
    receipt["body"]["verdict"]["tier"] = "XL"
    files["receipt.json"] = json.dumps(receipt).encode()
    play_runner(github_double, handle.run_id, files)
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(outcome, runs, github_double, contains="signature does not match the body (tampered)")


def test_a_receipt_for_another_head_is_rejected(github_double, gh, rules, runs, workdir):
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, artifact_files(rules, m=measurements(rules, head="c" * 40)))
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(
        outcome,
        runs,
        github_double,
        contains=f"receipt is for head_sha cccccccccccc, not the requested {HEAD[:12]}",
    )


def test_a_receipt_for_another_pr_is_rejected(github_double, gh, rules, runs, workdir):
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, artifact_files(rules, m=measurements(rules, pr=8)))
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(outcome, runs, github_double, contains="receipt is for PR #8, not #7")


def test_a_tier_that_does_not_follow_from_the_measurements_is_rejected(
    github_double, gh, rules, runs, workdir
):
    # the runner holds a trusted key, and signs a tier its own numbers do not earn
    handle = begin(gh, rules, runs)
    m = measurements(rules)
    honest = decide(m, rules)
    inflated = replace(honest, tier="XL", labels_add=("verified", "perf:XL"))
    play_runner(github_double, handle.run_id, artifact_files(rules, m=m, verdict=inflated))
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(
        outcome, runs, github_double,
        contains="signed verdict (PASS XL) does not follow from its measurements under these rules (they give PASS S)",
    )  # fmt: skip


def test_a_zip_with_path_traversal_is_rejected_and_writes_nothing(
    github_double, gh, rules, runs, workdir, tmp_path
):
    s = github_double.state
    handle = begin(gh, rules, runs)
    s.pick_up_run(handle.run_id, "box-1")
    s.complete_run(handle.run_id, "success")
    files = {**artifact_files(rules), "../../escaped.txt": b"owned"}
    s.add_artifact(handle.run_id, handle.request.artifact_name, zip_bytes(files))
    outcome = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert_alert(outcome, runs, github_double, contains="would be written outside the artifact folder")
    assert not (tmp_path / "escaped.txt").exists() and not (workdir.parent / "escaped.txt").exists()
    assert list(workdir.iterdir()) == []


def test_a_run_without_its_artifact_or_with_a_broken_one_is_retried(github_double, gh, rules, runs, workdir):
    s = github_double.state
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, {"report.md": b"only the report"})
    missing = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert isinstance(missing, Failed) and missing.retry and not missing.alert
    assert "artifact holds no receipt.json" in missing.reason

    retry = missing.retried_as
    s.pick_up_run(retry.run_id, "box-2")
    s.complete_run(retry.run_id, "success")
    s.add_artifact(retry.run_id, retry.request.artifact_name, b"not a zip at all")
    broken = advance(gh, rules, runs, retry, T0 + timedelta(minutes=60), workdir)
    assert isinstance(broken, Failed) and broken.alert and "not a zip archive" in broken.reason


def test_github_down_while_polling_is_pending_not_failed(github_double, gh, rules, runs, workdir):
    s = github_double.state
    handle = begin(gh, rules, runs)
    play_runner(github_double, handle.run_id, artifact_files(rules))
    s.inject("runs.get", Fault.server_error(502), Fault.server_error(502))
    down = advance(gh, rules, runs, handle, T0 + timedelta(minutes=30), workdir)
    assert isinstance(down, Pending) and "GitHub unavailable" in down.note
    assert isinstance(advance(gh, rules, runs, handle, T0 + timedelta(minutes=31), workdir), Finished)


def test_a_refused_dispatch_is_final_and_alerts(github_double, gh, rules, runs):
    bad = replace(rules, dispatch=replace(rules.dispatch, workflow="missing.yml"))
    outcome = start(gh, bad, runs, ask(bad), T0)
    assert isinstance(outcome, Failed) and outcome.alert and not outcome.retry
    assert "dispatch of missing.yml@main refused" in outcome.reason and "HTTP 404" in outcome.reason
    assert runs.in_flight() == [] and runs.record(outcome.handle.request.request_id).state == "failed"


# --- restart ----------------------------------------------------------------------------------------------


def test_in_flight_handles_survive_a_restart(github_double, gh, rules, tmp_path, workdir):
    path = tmp_path / "bot.sqlite"
    with Store(path) as store:
        handle = begin(gh, rules, DispatchRuns(store.dispatches))
    play_runner(github_double, handle.run_id, artifact_files(rules))

    with Store(path) as store:  # the poller starts again
        runs = DispatchRuns(store.dispatches)
        (resumed,) = runs.in_flight()
        assert resumed == handle
        done = advance(gh, rules, runs, resumed, T0 + timedelta(minutes=45), workdir)
        assert isinstance(done, Finished) and done.judgement.verdict.tier == "S"
        assert runs.in_flight() == []


def test_a_crash_between_intent_and_dispatch_is_found_or_retried(github_double, gh, rules, tmp_path, workdir):
    path = tmp_path / "bot.sqlite"
    req = ask(rules)
    intent = dispatch.DispatchHandle(
        req, workflow=WORKFLOW, ref="main", dispatched_at=T0, deadline=T0 + timedelta(hours=2)
    )
    with Store(path) as store:
        DispatchRuns(store.dispatches).save(intent, "dispatching")  # the crash comes before the GitHub call
    with Store(path) as store:
        runs = DispatchRuns(store.dispatches)
        (resumed,) = runs.in_flight()
        assert resumed == intent and resumed.run_id is None
        lost = advance(gh, rules, runs, resumed, T0 + timedelta(minutes=20), workdir)
        assert isinstance(lost, Failed) and lost.retried_as is not None
        assert [h.request.attempt for h in runs.in_flight()] == [2]


def test_a_closed_handle_is_never_reopened(runs, rules):
    req = ask(rules)
    handle = dispatch.DispatchHandle(
        req, workflow=WORKFLOW, ref="main", dispatched_at=T0, deadline=T0 + timedelta(hours=2), run_id=5
    )
    runs.save(handle)
    runs.close(handle, "failed", "gave up")
    runs.save(replace(handle, run_id=6), "in_flight")  # a stale poller's late save
    record = runs.record(req.request_id)
    assert (record.state, record.note, record.handle.run_id) == ("failed", "gave up", 5)
    with pytest.raises(ValueError, match="close\\(\\) ends 'finished'"):
        runs.save(handle, "finished")


# --- the pure checks --------------------------------------------------------------------------------------


def signed(rules, m: Measurements, key=RUNNER_KEY) -> tuple[dict[str, Any], dict[str, Any]]:
    files = artifact_files(rules, key=key, m=m)
    return json.loads(files["receipt.json"]), json.loads(files["result.json"])


def test_a_receipt_that_names_no_pr_is_bound_by_head_base_and_rules(rules):
    # `evalbot evaluate` without a PR number signs pr: null; head, base and rules still bind it
    req = ask(rules)
    receipt, result = signed(rules, measurements(rules, pr=None))
    assert check_artifact(receipt, result, req, rules).verdict.tier == "S"


def test_a_receipt_under_other_rules_is_retried_not_alerted(rules):
    req = replace(ask(rules), rules_hash="e" * 64)
    receipt, result = signed(rules, measurements(rules))
    with pytest.raises(ArtifactProblem) as info:
        check_artifact(receipt, result, req, rules)
    assert info.value.retry and not info.value.alert
    assert "made under rules" in info.value.reason


def test_a_receipt_answering_another_request_id_is_rejected(rules):
    req = ask(rules)
    receipt, result = signed(rules, measurements(rules))
    body = {**receipt["body"], "extra": {"request_id": "evalbot-7-someone-else-1"}}
    forged = receipts.sign(body, RUNNER_KEY)
    with pytest.raises(ArtifactProblem, match="answers request 'evalbot-7-someone-else-1'") as info:
        check_artifact(forged, result, req, rules)
    assert info.value.alert


def test_no_runner_keys_means_nothing_remote_is_trusted(rules):
    keyless = replace(rules, dispatch=replace(rules.dispatch, runner_public_keys=()))
    receipt, _ = signed(rules, measurements(rules))
    assert dispatch.trust_problem(receipt, keyless.dispatch.runner_public_keys).startswith("no runner keys")
    assert dispatch.trust_problem(receipt, rules.dispatch.runner_public_keys) is None
    two = (public_b64(ROGUE_KEY), public_b64(RUNNER_KEY))
    assert dispatch.trust_problem(receipt, two) is None  # any listed key will do


def test_requests_are_validated_and_ids_are_fresh(rules):
    a, b = ask(rules), ask(rules)
    assert a.request_id != b.request_id and a.request_id.startswith(f"evalbot-7-{HEAD[:12]}-1-")
    assert a.artifact_name == f"evalbot-result-{a.request_id}"
    with pytest.raises(ValueError, match="head_sha must be a full 40-hex git sha"):
        ask(rules, head="abc")
    with pytest.raises(ValueError, match="cannot go in a comma-separated list"):
        replace(a, exclude_runners=("a,b",))
    with pytest.raises(ValueError, match="pr must be a positive int"):
        ask(rules, pr=0)
    with pytest.raises(ValueError, match="a dispatched evaluation is of a PR"):
        new_request(EvalRequest(BASE, HEAD, HEAD, rules.rules_hash, rules.profile("cpu")))


def test_measurements_of_another_profile_are_rejected(rules):
    req = ask(rules, "gpu")
    receipt, result = signed(rules, measurements(rules))  # measured with the cpu profile
    with pytest.raises(ArtifactProblem, match="with profile 'cpu', not what was requested") as info:
        check_artifact(receipt, result, req, rules)
    assert info.value.alert and not info.value.retry
