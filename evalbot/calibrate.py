"""A/A calibration of a box: main judged against itself, N times, through the normal evaluate path.

Equal code has no true effect, so anything the verdict calls on it is a false positive: a tier awarded
or a regression called at a context. Run before trusting a new runner; the rows it stores (one per
model and context, see ``store.Calibration``) are what the dashboard shows for that box.

- *False-positive rate* per (model, context): the fraction of A/A runs whose estimates at that context
  (any metric) earned a tier or called a regression. The verdict-level rate counts every run whose
  verdict was not a PASS without a tier, so a gate that misfires on equal code (the spec AR-speed gate,
  a head-side crash blamed on the PR) shows up too. Runs that ended in INFRA_ERROR or SKIPPED measured
  nothing; they are listed as failures, outside both denominators.
- *MDE*: the median (and, in details, the max) of the runs' minimum detectable effect, i.e. the gain
  this box resolves at 80% power with the profile's pair count.
- *Noise CV*: the pooled within-run standard deviation of the per-pair ``ln(head / base)``, which for
  small noise is the coefficient of variation of the pair ratio. Pooled within runs so that a drift
  between runs (which pairing cancels) does not count as noise.

``summarize`` is pure; ``run`` is the only I/O: it calls ``judge.judge`` once per run.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evalbot import judge, stats, verdict
from evalbot.evaluate import checkout, prompts, runner
from evalbot.model import (
    DECODE_METRICS,
    ContextEstimate,
    EvalRequest,
    Measurements,
    RunOptions,
    Status,
    Verdict,
)
from evalbot.rules import Profile, Rules
from evalbot.store import Calibration

PRIMARY_METRIC = "decode_tps"  # the metric tiers are scored on; the row's MDE and noise are its


@dataclass(frozen=True)
class AARun:
    """One A/A evaluation: what was measured and what the verdict made of it."""

    measurements: Measurements
    verdict: Verdict


# one run's estimate at a (model, context, metric), the pairs behind it, and the run
_Entry = tuple[ContextEstimate, tuple[tuple[float, float], ...], AARun]


@dataclass(frozen=True)
class SpecRow:
    """The speculative track's rate on equal code at one (target, context): each completed run's estimate
    (runs with fewer than two spec runs there have none), the tiers it would have earned, and how many of
    the PR's spec runs were lossless."""

    model: str
    context: int
    ratios: tuple[float, ...]
    ci: tuple[tuple[float, float], ...]
    mdes: tuple[float, ...]
    tiers_awarded: int
    lossless: tuple[tuple[int, int], ...]  # per run: (lossless spec runs, spec runs)

    @property
    def runs(self) -> int:
        return len(self.ratios)

    @property
    def mde_median(self) -> float:
        return statistics.median(self.mdes)


@dataclass(frozen=True)
class CalibrationSummary:
    """Everything a calibration found: one row per (model, context), and the runs that measured nothing."""

    rows: tuple[Calibration, ...]
    runs: int  # A/A evaluations attempted
    completed: int  # those that reached a PASS or REJECT verdict
    verdict_false_positives: int  # completed runs whose verdict was not a PASS without a tier
    failures: tuple[str, ...]  # why each of the other runs measured nothing
    spec: tuple[SpecRow, ...] = ()  # the speculative track's rate, where the runs measured it

    @property
    def verdict_false_positive_rate(self) -> float | None:
        """Fraction of completed runs with a false verdict; None when no run completed."""
        return self.verdict_false_positives / self.completed if self.completed else None


def is_false_verdict(v: Verdict) -> bool:
    """On equal code the true verdicts are PASS without a tier, and INCONCLUSIVE on a box too noisy to tell."""
    return not ((v.status == Status.PASS and v.tier is None) or v.status == Status.INCONCLUSIVE)


def completed(v: Verdict) -> bool:
    """Whether a run measured the code to a verdict (not an infra error or a skip)."""
    return v.status in (Status.PASS, Status.REJECT, Status.INCONCLUSIVE)


def noise_cv(pair_sets: Sequence[Sequence[tuple[float, float]]]) -> float:
    """Pooled within-run SD of ln(head/base) over several runs' pairs; 0.0 with fewer than 2 pairs in every run."""
    squares, dof = 0.0, 0
    for pairs in pair_sets:
        d = [math.log(h) - math.log(b) for b, h in pairs]
        if len(d) < 2:
            continue
        mean = math.fsum(d) / len(d)
        squares += math.fsum((x - mean) ** 2 for x in d)
        dof += len(d) - 1
    return math.sqrt(squares / dof) if dof else 0.0


BIAS_MIN_RUNS = 3  # runs before the runs' agreement on a side bias is worth a statistic
# two-sided level at which the runs are said to agree on a side: a calibration is read once per context, and
# a false alarm costs a maintainer a box (at |t| >= 3 alone, 3 runs of equal code would raise it 1 time in 10)
BIAS_ALPHA = 0.01


def side_bias(ratios: Sequence[float]) -> dict[str, float | int | bool] | None:
    """Whether equal code's runs agree on a side: their mean log-ratio (head over base), its t statistic
    over the runs, the t it must reach (BIAS_ALPHA, two-sided, runs - 1 degrees of freedom) and `agreed`.
    Each run's CI allows for its own noise, but not for a bias every run shares (a harness that treats the
    sides differently, or a box that does): a judge whose runs all lean one way moves every PR's score by
    that much. Measured on an Intel guest, 12 runs at once: -1.3% at one context, t -5.5
    (docs/benchmarks.md, #40). None with fewer than BIAS_MIN_RUNS runs."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < BIAS_MIN_RUNS:
        return None
    mean = statistics.fmean(logs)
    # runs that agree exactly (a fixture's, never a box's) get a finite t: the row goes into JSON and the store
    sd = max(statistics.stdev(logs), 1e-9)
    t = mean / (sd / math.sqrt(len(logs)))
    needed = stats.t_quantile(1.0 - BIAS_ALPHA / 2, len(logs) - 1)
    return {
        "change": math.exp(mean) - 1.0,
        "t": t,
        "t_needed": needed,
        "runs": len(logs),
        "agreed": abs(t) >= needed,
    }


def spec_rows(done: Sequence[AARun], rules: Rules) -> tuple[SpecRow, ...]:
    """The speculative rate of each completed run, per (target, context), as the verdict scores it
    (`verdict.spec_estimates`): the spec track's own false positives and MDE on this box."""
    found: dict[tuple[str, int], list[tuple[ContextEstimate, tuple[int, int]]]] = {}
    for r in done:
        lossless = {(s.target, s.context): (s.lossless_runs, s.runs) for s in r.measurements.spec}
        for e in verdict.spec_estimates(r.measurements.spec, rules):
            found.setdefault((e.model, e.context), []).append((e, lossless.get((e.model, e.context), (0, 0))))
    return tuple(
        SpecRow(
            model,
            context,
            tuple(e.ratio for e, _ in entries),
            tuple((e.ci_low, e.ci_high) for e, _ in entries),
            tuple(e.mde for e, _ in entries),
            sum(e.tier is not None for e, _ in entries),
            tuple(lossless for _, lossless in entries),
        )
        for (model, context), entries in sorted(found.items())
    )


def summarize(runs: Sequence[AARun], *, box: str, at: str, rules: Rules | None = None) -> CalibrationSummary:
    """Per (model, context): false-positive rate, MDE and noise of A/A runs; see the module docstring. With
    the rules, the speculative track's rate too (`spec_rows`)."""
    done = [r for r in runs if completed(r.verdict)]
    failures = tuple(
        f"run {i}: {r.verdict.status.value}: {'; '.join(r.verdict.reasons)[:300]}"
        for i, r in enumerate(runs, 1)
        if not completed(r.verdict)
    )
    false_verdicts = sum(is_false_verdict(r.verdict) for r in done)
    verdict_rate = false_verdicts / len(done) if done else None
    found: dict[tuple[str, int], dict[str, list[_Entry]]] = {}  # (model, context) -> metric -> entries
    for r in done:
        pairs = {(t.model, t.context, t.metric): t.pairs for t in r.measurements.throughput}
        for e in r.verdict.estimates:
            per_metric = found.setdefault((e.model, e.context), {})
            per_metric.setdefault(e.metric, []).append((e, pairs.get((e.model, e.context, e.metric), ()), r))
    rows = []
    for (model, context), per_metric in sorted(found.items()):
        # the clock that scored in each run (wall or CPU time, verdict.score_clocks), else the wall clock
        scored = [entry for m in DECODE_METRICS for entry in per_metric.get(m, []) if entry[0].scored]
        metric = (
            "/".join(sorted({e.metric for e, _, _ in scored}))
            if scored
            else (PRIMARY_METRIC if PRIMARY_METRIC in per_metric else sorted(per_metric)[0])
        )
        primary = scored or per_metric[metric]
        # a run is a false positive here if any metric's estimate at this context was called
        called: dict[int, tuple[bool, bool]] = {}
        for entries in per_metric.values():
            for e, _, r in entries:
                tier, regression = called.get(id(r), (False, False))
                called[id(r)] = (tier or e.tier is not None, regression or e.regression)
        n_runs = len(called)
        n_false = sum(t or g for t, g in called.values())
        mdes = [e.mde for e, _, _ in primary]
        details: dict[str, Any] = {
            "metric": metric,
            "runs_attempted": len(runs),
            "failed_runs": len(failures),
            "false_positives": n_false,
            "tiers_awarded": sum(t for t, _ in called.values()),
            "regressions_called": sum(g for _, g in called.values()),
            "verdict_false_positive_rate": verdict_rate,
            "mde_median": statistics.median(mdes),
            "mde_max": max(mdes),
            "mde_min": min(mdes),
            "ratios": [e.ratio for e, _, _ in primary],
            "ci": [[e.ci_low, e.ci_high] for e, _, _ in primary],
            "pairs": [e.n for e, _, _ in primary],
            # the raw two-sided miss rate of the 95% CI on equal code, tiers and tolerance aside
            "ci_excludes_one": sum(not e.ci_low <= 1.0 <= e.ci_high for e, _, _ in primary),
            # do the runs agree on a side? (a bias each run's CI cannot show)
            "side_bias": side_bias([e.ratio for e, _, _ in primary]),
            "noise_cv_per_run": [noise_cv([p]) for _, p, _ in primary],
            "other_metrics": {
                m: {
                    "mde_median": statistics.median(e.mde for e, _, _ in entries),
                    "noise_cv": noise_cv([p for _, p, _ in entries]),
                    "ratios": [e.ratio for e, _, _ in entries],
                }
                for m, entries in sorted(per_metric.items())
                if m != metric
            },
            "revision": primary[0][2].measurements.provenance.base_sha,
            "rules_hash": primary[0][2].verdict.rules_hash,
            "prompt_seeds": [r.measurements.provenance.prompt_seed for _, _, r in primary],
            "box_identity": primary[0][2].measurements.provenance.box,
        }
        rows.append(
            Calibration(
                at=at,
                box=box,
                profile=primary[0][2].measurements.provenance.profile,
                model=model,
                context=context,
                runs=n_runs,
                false_positive_rate=n_false / n_runs,
                mde=statistics.median(mdes),
                noise_cv=noise_cv([p for _, p, _ in primary]),
                details=details,
            )
        )
    spec = spec_rows(done, rules) if rules is not None else ()
    return CalibrationSummary(tuple(rows), len(runs), len(done), false_verdicts, failures, spec)


Judge = Callable[[EvalRequest, runner.Workspace, runner.Log, Any], judge.Judgement]


def run(ws: runner.Workspace, rev: str, profile: Profile, options: RunOptions, runs: int, log: runner.Log, *,
        judge_fn: Judge = judge.judge) -> list[AARun]:  # fmt: skip
    """Judge rev against itself `runs` times, each with a fresh prompt seed.

    The revision is resolved to a commit once, so every run measures the same code even if the branch
    moves meanwhile. Receipts are left unsigned: a calibration is never published as a verdict.
    """
    if runs < 1:
        raise ValueError(f"runs: expected at least 1, got {runs}")
    sha, _ = checkout.resolve(ws.repo, rev)
    out = []
    for i in range(1, runs + 1):
        log(f"calibration run {i}/{runs}: {rev} ({sha[:12]}) against itself")
        fresh = dataclasses.replace(options, seed=prompts.fresh_seed())
        one = runner.request(ws, sha, sha, profile, fresh, title=f"calibration {i}/{runs}")
        judged = judge_fn(one, ws, log, None)
        out.append(AARun(judged.measurements, judged.verdict))
        v = judged.verdict
        log(f"calibration run {i}/{runs}: {v.status.value}{' ' + v.tier if v.tier else ''}")
        if not completed(v):  # what the maintainer needs to fix the box: the stage, and the stderr tail
            for f in judged.measurements.failures:
                tail = f.log_tail.strip()[-1500:]
                log(
                    f"calibration run {i}/{runs}: {f.side.value} {f.stage}: {f.message}"
                    + (f"\n{tail}" if tail else "")
                )
    return out
