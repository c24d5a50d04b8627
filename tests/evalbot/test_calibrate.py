"""evalbot.calibrate: the A/A summary on verdicts decided from constructed pairs, the driver's A/A configs,
the store round trip, and `evalbot calibrate` end to end on the fixture engine."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from evalbot import calibrate, stats
from evalbot import verdict as verdict_mod
from evalbot.cli import calibrate_cmd
from evalbot.codec import to_dict
from evalbot.evaluate import runner
from evalbot.judge import Judgement
from evalbot.model import (
    EvalRequest,
    Failure,
    Measurements,
    Provenance,
    RunOptions,
    Side,
    SpecResult,
    Status,
    ThroughputPairs,
)
from evalbot.rules import default_rules_dir, load_rules
from evalbot.store import Store, iso
from evalbot.verdict.decide import decide
from tests.evalbot.test_fixture_e2e import write_rules
from tests.fixtures import fixture_engine_branches as fb

MODEL = "qwen2.5-coder-0.5b"
SHA = "a" * 40
AT = "2026-11-30T10:00:00.000000Z"


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


def pairs(ratio: float, seed: int, n: int = 8, noise: float = 0.003) -> tuple[tuple[float, float], ...]:
    rng = random.Random(seed)
    return tuple(
        (b := 50 * (1 + 0.01 * i) * (1 + rng.gauss(0, noise)), b * ratio * (1 + rng.gauss(0, noise)))
        for i in range(n)
    )


def aa_run(rules, seed: int, decode: dict[int, float], prefill: dict[int, float] | None = None,
           failures: tuple[Failure, ...] = ()) -> calibrate.AARun:  # fmt: skip
    """One A/A run: decode (and prefill) pairs at each context with the given true ratio, and its verdict."""
    prefill = prefill or {}
    tps = []
    for ctx, ratio in decode.items():
        tps.append(ThroughputPairs(MODEL, ctx, "decode_tps", pairs(ratio, seed * 1000 + ctx)))
        tps.append(ThroughputPairs(MODEL, ctx, "prefill_tps", pairs(prefill.get(ctx, 1.0), seed * 1000 + ctx + 1),
                                   scored=False))  # fmt: skip
    prov = Provenance("repo", SHA, SHA, SHA, rules.rules_hash, "cpu", prompt_seed=seed, box={"cpu": "test"})
    m = Measurements(prov, throughput=() if failures else tuple(tps), failures=failures)
    return calibrate.AARun(m, decide(m, rules))


# ---------------------------------------------------------------- the summary


def test_noise_cv_pools_within_runs_so_drift_between_runs_is_not_noise():
    e = math.exp
    run1 = [(1.0, e(0.01)), (1.0, e(-0.01))]  # mean 0, squares 2e-4
    run2 = [(2.0, 2 * e(0.12)), (3.0, 3 * e(0.10))]  # mean 0.11 (a shift between runs), squares 2e-4
    assert calibrate.noise_cv([run1, run2]) == pytest.approx(math.sqrt(4e-4 / 2), rel=1e-9)
    one_pair = [(1.0, 1.5)]  # no degrees of freedom: adds nothing
    assert calibrate.noise_cv([run1, one_pair]) == pytest.approx(math.sqrt(2e-4), rel=1e-9)
    assert calibrate.noise_cv([]) == 0.0


def test_only_a_pass_without_a_tier_is_a_true_verdict_on_equal_code(rules):
    honest = aa_run(rules, 1, {128: 1.0, 512: 1.0})
    tiered = aa_run(rules, 2, {128: 1.06, 512: 1.0})
    regressed = aa_run(rules, 3, {128: 1.0, 512: 0.9})
    assert (honest.verdict.status, honest.verdict.tier) == (Status.PASS, None)
    assert tiered.verdict.status == Status.PASS and tiered.verdict.tier is not None
    assert regressed.verdict.status == Status.REJECT
    assert [calibrate.is_false_verdict(r.verdict) for r in (honest, tiered, regressed)] == [False, True, True]


def test_summary_counts_tiers_and_regressions_per_context_and_leaves_infra_errors_out(rules):
    runs = [
        aa_run(rules, 1, {128: 1.0, 512: 1.0}),
        aa_run(rules, 2, {128: 1.06, 512: 1.0}),  # a tier at 128
        aa_run(rules, 3, {128: 1.0, 512: 0.9}),  # a regression at 512
        aa_run(rules, 4, {128: 1.0, 512: 1.0}, prefill={128: 0.9}),  # prefill regresses at 128: counts there
        aa_run(rules, 5, {}, failures=(Failure(Side.BASE, "run", "main crashed"),)),
    ]
    s = calibrate.summarize(runs, box="box-1", at=AT)
    assert (s.runs, s.completed, s.verdict_false_positives) == (5, 4, 3)
    assert s.verdict_false_positive_rate == pytest.approx(3 / 4)
    assert len(s.failures) == 1 and "run 5: INFRA_ERROR" in s.failures[0] and "main crashed" in s.failures[0]

    by_ctx = {c.context: c for c in s.rows}
    assert sorted(by_ctx) == [128, 512]
    for c in s.rows:
        assert (c.at, c.box, c.profile, c.model, c.runs) == (AT, "box-1", "cpu", MODEL, 4)
        assert c.details["metric"] == "decode_tps" and c.details["failed_runs"] == 1
        assert c.details["runs_attempted"] == 5 and c.details["prompt_seeds"] == [1, 2, 3, 4]
        assert c.details["revision"] == SHA and c.details["box_identity"] == {"cpu": "test"}
    c128, c512 = by_ctx[128], by_ctx[512]
    assert c128.false_positive_rate == pytest.approx(2 / 4)
    assert (c128.details["tiers_awarded"], c128.details["regressions_called"]) == (1, 1)
    assert c512.false_positive_rate == pytest.approx(1 / 4)
    assert (c512.details["tiers_awarded"], c512.details["regressions_called"]) == (0, 1)

    # MDE: the median (and max) of the decode estimates' own MDEs; noise: their pairs, pooled
    for ctx, c in by_ctx.items():
        decode = [next(t.pairs for t in r.measurements.throughput if (t.context, t.metric) == (ctx, "decode_tps"))
                  for r in runs[:4]]  # fmt: skip
        mdes = [stats.estimate(p).mde for p in decode]
        assert c.mde == pytest.approx(statistics.median(mdes))
        assert c.details["mde_max"] == pytest.approx(max(mdes))
        assert c.noise_cv == pytest.approx(calibrate.noise_cv(decode))
        assert 0.002 < c.noise_cv < 0.01  # the pairs' noise: two sides of 0.3% each, about 0.42% per ratio
        assert c.details["ratios"] == pytest.approx([stats.estimate(p).ratio for p in decode])
        assert set(c.details["other_metrics"]) == {"prefill_tps"}
    assert c128.details["ci_excludes_one"] >= 1  # the +6% run


def test_runs_that_all_lean_one_way_are_called_a_side_bias_each_runs_ci_could_not_show(rules, capsys):
    """Each A/A run's CI covers 1.0 (no false verdict), but every run reads the PR about 1.3% slow at one
    context: the summary says the runs agree on a bias there, and not at the other (the device's Intel
    guest, 2026-12-07: -1.3%, t -5.5 over 12 runs at ctx 128, nothing at 512)."""
    rng = random.Random(11)
    runs = [aa_run(rules, i, {128: 0.987 * math.exp(rng.gauss(0, 0.004)), 512: math.exp(rng.gauss(0, 0.004))})
            for i in range(1, 9)]  # fmt: skip
    by_ctx = {c.context: c for c in calibrate.summarize(runs, box="b", at=AT).rows}
    lean, level = by_ctx[128].details["side_bias"], by_ctx[512].details["side_bias"]
    assert lean["agreed"] and lean["t"] < -3 and lean["runs"] == 8
    assert lean["change"] == pytest.approx(-0.013, abs=0.004)
    assert not level["agreed"] and abs(level["change"]) < 0.005
    assert calibrate.side_bias([0.99, 1.01]) is None  # too few runs to say
    assert calibrate.side_bias([1.0, 1.0, 1.0])["agreed"] is False
    # three runs that happen to lean one way at |t| 3.5 (the fixture engine did, once): 1 in 14 on equal code
    # with 2 degrees of freedom, no bias; 12 runs at the Intel guest's t -5.5 are one
    assert not calibrate.side_bias([1.0396 * math.exp(x) for x in (-0.02, 0.0, 0.02)])["agreed"]
    assert calibrate.side_bias([0.9873 * math.exp(0.008 * ((i % 3) - 1)) for i in range(12)])["agreed"]
    summary = calibrate.summarize(runs, box="b", at=AT)
    calibrate_cmd._render(summary, "b", "cpu", "main", Path("state.db"), lowest_tier=None)
    said = [line for line in capsys.readouterr().out.splitlines() if "agree on a bias" in line]
    assert len(said) == 1 and "ctx 128" in said[0] and "reads main faster" in said[0], said


def test_the_speculative_rate_of_each_run_is_reported_beside_the_decode_rows(rules, capsys):
    """`evalbot calibrate` with spec runs: the spec track's estimate per run (its own MDE on equal code, a
    tier it would have earned), as the verdict scores it, and how many of the PR's spec runs were lossless."""
    rng = random.Random(3)
    runs = []
    for i in range(1, 4):
        r = aa_run(rules, i, {128: 1.0, 512: 1.0})
        spec_pairs = tuple(
            (b := 9 * (1 + rng.gauss(0, 0.05)), b * (1 + rng.gauss(0, 0.05))) for _ in range(16)
        )
        sr = SpecResult("qwen2.5-coder-0.5b", "ngram", 4, 16, 16, None, 2.0, 2.0, spec_pairs=spec_pairs,
                        context=128, spec_blocks=tuple(1 + k % 5 for k in range(16)))  # fmt: skip
        m = dataclasses.replace(r.measurements, spec=(sr,))
        runs.append(calibrate.AARun(m, decide(m, rules)))
    summary = calibrate.summarize(runs, box="b", at=AT, rules=rules)
    assert len(summary.spec) == 1
    row = summary.spec[0]
    assert (row.model, row.context, row.runs, row.lossless) == ("qwen2.5-coder-0.5b", 128, 3, ((16, 16),) * 3)
    want = [verdict_mod.spec_estimates(r.measurements.spec, rules)[0] for r in runs]
    assert row.ratios == pytest.approx([e.ratio for e in want]) and row.mdes == pytest.approx(
        [e.mde for e in want]
    )
    assert row.tiers_awarded == sum(e.tier is not None for e in want)
    assert 0.02 < row.mde_median < 0.2  # 16 runs of 5% noise a side
    assert calibrate.summarize(runs, box="b", at=AT).spec == ()  # without the rules: the decode rows alone
    calibrate_cmd._render(summary, "b", "cpu", "main", Path("state.db"), lowest_tier=None)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("speculative rate")]
    assert len(said) == 1 and "3 runs" in said[0] and "48/48 spec runs lossless" in said[0], said


def test_no_completed_run_gives_no_rows(rules):
    s = calibrate.summarize(
        [aa_run(rules, 1, {}, failures=(Failure(Side.HARNESS, "sandbox", "no bwrap"),))], box="b", at=AT
    )
    assert s.rows == () and s.completed == 0 and s.verdict_false_positive_rate is None


def test_summary_rows_round_trip_through_the_store(rules, tmp_path):
    s = calibrate.summarize([aa_run(rules, i, {128: 1.0, 512: 1.0}) for i in range(1, 4)], box="b", at=AT)
    with Store(tmp_path / "state.db") as store:
        assert all(store.calibrations.record(c) for c in s.rows)
    with Store(tmp_path / "state.db") as store:
        assert store.calibrations.recorded("cpu") == list(s.rows) and store.calibrations.recorded("gpu") == []


# ---------------------------------------------------------------- the driver


def test_run_judges_one_resolved_commit_against_itself_with_fresh_seeds(rules, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "f.txt").write_text("x\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    seen: list[EvalRequest] = []

    def fake_judge(req, ws, log, key):
        seen.append(req)
        assert key is None  # a calibration is never published, so it is never signed
        m = aa_run(rules, len(seen), {128: 1.0}).measurements
        return Judgement(m, decide(m, rules), {})

    ws = runner.Workspace(repo, tmp_path / "work", rules)
    options = RunOptions(seed=7)
    logged: list[str] = []
    out = calibrate.run(ws, "main", rules.profile("cpu"), options, 3, logged.append, judge_fn=fake_judge)
    assert len(out) == 3 and all(r.verdict.status == Status.PASS for r in out)
    assert [(r.base_sha, r.head_sha, r.measured_sha, r.pr) for r in seen] == [(sha, sha, sha, None)] * 3
    assert {r.profile.name for r in seen} == {"cpu"} and {r.rules_hash for r in seen} == {rules.rules_hash}
    assert len({r.options.seed for r in seen}) == 3 and 7 not in {r.options.seed for r in seen}
    assert any("calibration run 3/3" in line for line in logged)
    with pytest.raises(ValueError, match="at least 1"):
        calibrate.run(ws, "main", rules.profile("cpu"), options, 0, logged.append, judge_fn=fake_judge)


# ---------------------------------------------------------------- end to end on the fixture engine

_SANDBOX = subprocess.run(
    [sys.executable, "-c", "from evalbot.evaluate.sandbox import sandbox_available as a; raise SystemExit(not a())"],
    capture_output=True,
).returncode == 0  # fmt: skip


@pytest.mark.skipif(not _SANDBOX, reason="bubblewrap cannot create namespaces here")
@pytest.mark.timing
def test_calibrate_cli_on_the_fixture_engine_stores_one_row_per_context(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("EVALBOT_SIGNING_KEY", None)
    fetched = subprocess.run([sys.executable, "-m", "engine.registry", "fetch", fb.MODEL_NAME], cwd=fb.TEMPLATE,
                             env=env, capture_output=True, text=True, check=True)  # fmt: skip
    model = Path(fetched.stdout.strip().splitlines()[-1])
    rules_dir = write_rules(tmp_path / "rules", hashlib.sha256(model.read_bytes()).hexdigest())
    repo = fb.make_repo(tmp_path / "repo")
    state = tmp_path / "state" / "state.db"
    argv = [sys.executable, "-m", "evalbot", "calibrate", "--repo", str(repo), "--rev", "main", "--runs", "2",
            "--rules", str(rules_dir), "--profile", "cpu", "--max-pairs", "2", "--no-spec", "--no-accuracy",
            "--box", "fixture-box", "--state", str(state), "--work-dir", str(tmp_path / "work"), "--json"]  # fmt: skip
    # from a neutral cwd: this checkout's own `engine` package must not shadow the judged one
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert (summary["runs"], summary["completed"], summary["failures"]) == (2, 2, [])

    with Store(state) as store:
        rows = store.calibrations.recorded("cpu")
    assert [(c.box, c.profile, c.model, c.context, c.runs) for c in rows] == [
        ("fixture-box", "cpu", fb.MODEL_NAME, 128, 2),
        ("fixture-box", "cpu", fb.MODEL_NAME, 512, 2),
    ]
    main_sha = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "main"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for c in rows:
        assert c.false_positive_rate in (0.0, 0.5, 1.0)
        assert c.mde > 0 and math.isfinite(c.mde) and c.noise_cv >= 0
        assert c.details["pairs"] == [2, 2] and len(c.details["ratios"]) == 2
        assert c.details["revision"] == main_sha
        assert len(set(c.details["prompt_seeds"])) == 2  # fresh prompts each run
        assert c.at == rows[0].at and c.at <= iso()
    assert summary["rows"] == [to_dict(c) for c in rows]  # --json prints what was stored
