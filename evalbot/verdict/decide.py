"""Gates and tiers -> Verdict. Pure: a function of Measurements and Rules, no I/O.

Order of precedence: a skipped evaluation is SKIPPED; a failure that is not the head's own fault
(the harness, the box, a toolchain, or main failing too) is INFRA_ERROR and never counts against the
contributor; otherwise every gate is evaluated and a failed correctness gate (accuracy, speculative
decoding, the decode audit) is a REJECT; main failing the decode audit too is INFRA_ERROR. Then the A/B pairs must have resolved the smallest tier: with
an MDE above its floor at any scored context, the outcome is INCONCLUSIVE (infra-class, measured
again), never a "PASS, no tier". What a wide interval still proves stands: a guarded CI wholly below the
regression bar, at least an MDE below 1, is a REJECT, and a tier earned by the CI's lower bound at a context precise enough for that
tier (`tracks.resolves`: its MDE at most the tier's floor, or its lower bound an MDE past it) is a PASS where every imprecise context's CI lies wholly above the
bar (more pairs could only raise the tier). Tiers come from the lower bound of the gain's
95% CI at the strongest scored context; a regression needs the CI's upper bound below the tolerance at
a guarded context. The correctness gates themselves are built in `gates`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from evalbot import stats
from evalbot.model import (
    DECODE_METRICS,
    UTILIZATION_METRIC,
    ContextEstimate,
    Failure,
    Gate,
    GateKind,
    Measurements,
    Side,
    Status,
    ThroughputPairs,
    TrackScore,
    Verdict,
)
from evalbot.rules import Rules
from evalbot.verdict import tracks
from evalbot.verdict.gates import accuracy_gates, audit_gates, audit_passes, spec_gates, spec_unresolved

# head-side failures that are the environment's fault, not the contributor's
INFRA_STAGES = frozenset({"toolchain", "gpu", "box", "sandbox", "harness", "network", "disk"})
# The fewest degrees of freedom an interval needs to decide a tier or a regression. Equal code earns a tier
# when its t statistic clears the interval's quantile and an MDE's worth more (about 2.3 standard errors
# past the floor's quantile): with 1 degree of freedom (2 blocks' means) the t tails are Cauchy's and that
# happens in about 1.2% of A/A runs (CI read +11.1% [+7.8%, +14.4%] on equal code, 2026-12-06); with 2,
# 0.5%; with 4 (the shipped profiles' least), 0.14%. (`tracks.MIN_DF`, which the spec gates read too.)
MIN_DF = tracks.MIN_DF


def decide(m: Measurements, rules: Rules) -> Verdict:
    """The verdict for one evaluation."""
    if m.skipped_reason:
        return _verdict(rules, Status.SKIPPED, reasons=(m.skipped_reason,))
    infra = [f for f in m.failures if _is_infra(f)]
    if infra:
        return _verdict(
            rules,
            Status.INFRA_ERROR,
            reasons=tuple(_describe(f) for f in infra),
            add=(rules.labels.infra_error,),
        )
    head_failures = [f for f in m.failures if f.side == Side.HEAD]
    if head_failures:
        return _verdict(
            rules,
            Status.REJECT,
            reasons=tuple(_describe(f) for f in head_failures),
            gates=tuple(
                Gate(f"head {f.stage}", None, "succeeds", False, f.message, kind=GateKind.HEAD)
                for f in head_failures
            ),
        )
    try:
        estimates = tuple(_estimate(tp, rules) for tp in m.throughput)
    except stats.StatsError as exc:
        return _verdict(
            rules,
            Status.INFRA_ERROR,
            reasons=(f"not enough usable measurements: {exc}",),
            add=(rules.labels.infra_error,),
        )
    if not estimates:
        return _verdict(
            rules,
            Status.INFRA_ERROR,
            reasons=("no throughput was measured",),
            add=(rules.labels.infra_error,),
        )
    profile = m.provenance.profile
    estimates = score_clocks(tracks.decode_scored(estimates, rules, profile), rules)
    scores = tracks.track_scores(estimates, tracks.spec_estimates(m.spec, rules), rules, profile)

    audits = tuple(m.audits)
    main_audit = [a for a in audits if a.side is Side.BASE and not audit_passes(a, audits, rules)]
    if main_audit:  # main's own decode disagrees with the reference: the reference or the harness is off
        return _verdict(
            rules,
            Status.INFRA_ERROR,
            add=(rules.labels.infra_error,),
            reasons=tuple(
                f"main fails the decode audit too at ctx {a.context} ({a.share:.1%} agree, {a.violations} beyond a "
                f"near-tie): a reference or harness problem, not the PR's"
                for a in main_audit
            ),
        )
    gates = [
        *_throughput_gates(estimates, rules),
        *audit_gates(audits, rules),
        *accuracy_gates(m.accuracy, rules),
        *spec_gates(m.spec, rules),
    ]
    failed = [g for g in gates if not g.passed]
    scored = [e for e in estimates if e.scored and e.metric in DECODE_METRICS]
    best = max(scored, key=lambda e: (rules.tier_rank(e.tier), e.ci_low), default=None)
    mde = max((e.mde for e in scored), default=None)
    # correctness gates decide whatever the noise, and so does a regression its context resolves
    if any(g.kind is not GateKind.REGRESSION for g in failed) or any(
        _proven_regression(e) for e in estimates
    ):
        return _reject(rules, gates, failed, estimates, best, mde, scores)
    floor = rules.tiers[0]
    unresolved = _unresolved(estimates, scored, best, rules) + spec_unresolved(m.spec, rules)
    if unresolved:
        reasons = tuple(
            f"inconclusive: at ctx {e.context} {e.metric} reads {e.ratio:.3f}x [{e.ci_low:.3f}, {e.ci_high:.3f}] "
            f"from too few process blocks ({e.df} degree{'s' if e.df != 1 else ''} of freedom, {e.n} pairs): "
            f"an interval needs {MIN_DF} to decide a tier, none or a regression; the PR will be measured again"
            if _thin(e)
            else f"inconclusive: at ctx {e.context} {e.metric} reads {e.ratio:.3f}x [{e.ci_low:.3f}, {e.ci_high:.3f}]"
            f", below the {rules.gates.no_regression.min_ratio:.2f}x bar but resolved only to {e.mde:.1%} (MDE, "
            f"{e.n} pairs): too imprecise to call a regression; the PR will be measured again"
            if (e.regression and e.mde <= floor.lower_bound) or e.metric not in DECODE_METRICS
            else f"inconclusive: at ctx {e.context} the A/B pairs resolve only gains of {e.mde:.1%} "
            f"(MDE, {e.n} pairs), above {floor.name}'s floor of {floor.lower_bound:.1%}; the PR will "
            f"be measured again"
            for e in unresolved
        )
        return _verdict(
            rules,
            Status.INCONCLUSIVE,
            gates=tuple(gates),
            reasons=reasons,
            add=(rules.labels.inconclusive,),
            estimates=estimates,
            mde=mde,
            scores=scores,
        )
    top = tracks.overall(scores, rules)
    spec_top = top if top is not None and top.metric != tracks.DECODE_TRACK else None
    if spec_top is not None and rules.tier_rank(spec_top.tier) <= rules.tier_rank(
        best.tier if best else None
    ):
        spec_top = None  # decode earned as much: the overall tier is decode's
    tier = spec_top.tier if spec_top is not None else (best.tier if best else None)
    add = [rules.labels.verified, *(s.label for s in scores if s.label)]
    if spec_top is not None and spec_top.estimate is not None:
        e = spec_top.estimate
        add.append(rules.tier(spec_top.tier or "").label)
        reason = (
            f"{tier}: {e.ratio - 1:+.1%} in the {spec_top.track} track ({e.model}, ctx {e.context}; 95% CI "
            f"{e.ci_low - 1:+.1%} to {e.ci_high - 1:+.1%}); every gate passed"
        )
    elif best is not None and tier:  # a tier comes from a best estimate
        add.append(rules.tier(tier).label)
        where = f"on {best.model} " if len({s.model for s in scores}) > 1 else ""
        reason = (
            f"{tier}: {best.ratio - 1:+.1%} {where}at ctx {best.context} "
            f"(95% CI {best.ci_low - 1:+.1%} to {best.ci_high - 1:+.1%}); every gate passed"
        )
    elif best is not None:
        reason = (
            f"no tier: the gain's 95% CI lower bound is {_signed(best.ci_low - 1)} at best "
            f"(ctx {best.context}), below {rules.tiers[0].name}'s {rules.tiers[0].lower_bound:.1%}"
        )
    else:
        reason = "no scored context"
    # a track that counts apart (tracks.yaml `overall: false`) earned a tier of its own: said beside the overall
    # tier, so that "no tier" does not read as nothing earned
    apart = [
        (s, s.estimate) for s in scores if not s.overall and s.tier is not None and s.estimate is not None
    ]
    if apart and spec_top is None:
        reason += "; counted apart: " + ", ".join(
            f"{s.tier} in the {s.track} track ({s.model}, {e.ratio - 1:+.1%} at ctx {e.context})"
            for s, e in apart
        )
    return _verdict(
        rules,
        Status.PASS,
        gates=tuple(gates),
        reasons=(reason,),
        add=tuple(add),
        estimates=estimates,
        best=best if tier else None,
        mde=mde,
        scores=scores,
        tier=tier,
    )


def score_clocks(estimates: tuple[ContextEstimate, ...], rules: Rules) -> tuple[ContextEstimate, ...]:
    """At each (model, context) exactly one decode clock scores. The CPU clock (the engine tree's CPU time,
    which steal and preemption do not move) scores where the utilization ratio's CI lies within 1 +- the
    tolerance: the head turns CPU time into wall time as main does, so CPU time measures its speed. Then
    wall time stays guarded (a head may not be slower on it) but scores nothing. Elsewhere, or without a
    CPU reading, wall time scores and the CPU estimate is shown only: a head that sleeps instead of
    spinning, adds threads, or works outside the metered tree moves its utilization, and is judged on wall
    time, where none of that helps. A CPU clock measured but not scored (a GPU profile's) never takes wall
    time's place."""
    tol = rules.gates.timing.cpu_clock_tolerance
    by_key = {(e.model, e.context, e.metric): e for e in estimates}
    out = []
    for e in estimates:
        key = (e.model, e.context)
        util, cpu = by_key.get((*key, UTILIZATION_METRIC)), by_key.get((*key, "decode_cpu_tps"))
        cpu_ok = (
            util is not None
            and cpu is not None
            and cpu.scored
            and 1 - tol <= util.ci_low
            and util.ci_high <= 1 + tol
        )
        if e.metric == UTILIZATION_METRIC or (e.metric == "decode_cpu_tps" and not cpu_ok):
            e = dataclasses.replace(e, scored=False, guarded=False, tier=None, regression=False)
        elif e.metric == "decode_tps" and cpu_ok:
            e = dataclasses.replace(e, scored=False, tier=None)
        out.append(e)
    return tuple(out)


def no_pair_could_change(throughput: Sequence[ThroughputPairs], rules: Rules) -> bool:
    """The A/B runs' early stop: on the clock that scores at each context the MDE resolves the smallest tier
    and no tier floor lies inside the CI, and no guarded CI straddles the regression bar, so further pairs
    could narrow the intervals but not move the verdict."""
    try:
        estimates = score_clocks(tuple(_estimate(tp, rules) for tp in throughput), rules)
    except stats.StatsError:
        return False
    floors = [1.0 + t.lower_bound for t in rules.tiers]
    bar = rules.gates.no_regression.min_ratio
    for e in estimates:
        if e.scored and _thin(e):
            return False
        if e.guarded and e.ci_low < bar < e.ci_high:
            return False
        if (
            e.scored
            and e.metric in DECODE_METRICS
            and (e.mde > rules.tiers[0].lower_bound or any(e.ci_low < f < e.ci_high for f in floors))
        ):
            return False
    return bool(estimates)


def _proven_regression(e: ContextEstimate) -> bool:
    """A guarded CI wholly below the regression bar, from a context precise enough for the slowdown it shows:
    the upper bound at least an MDE below 1. The mirror of a tier's rule (below): equal code reads that slow
    about as rarely as it earns a tier, however noisy the box, where a bare CI below the bar would call 2.5%
    of very noisy A/A runs a regression."""
    return e.regression and e.ci_high * (1.0 + e.mde) <= 1.0 and not _thin(e)


def _unresolved(
    estimates: tuple[ContextEstimate, ...],
    scored: list[ContextEstimate],
    best: ContextEstimate | None,
    rules: Rules,
) -> list[ContextEstimate]:
    """The contexts whose imprecision could change the verdict. An MDE above the smallest tier's floor at a
    scored context leaves "no tier" and "no regression" unproven there, and so does a regression read too
    imprecisely to stand. A tier stands where the context that earned it resolves that tier
    (`tracks.resolves`: its MDE at most the tier's floor, or its CI's lower bound an MDE past the floor: a
    4x speedup read at a 61% MDE earns XL, and equal code cannot, since its CI's lower bound would have to
    clear the floor by about 2 standard errors more than an MDE's worth).
    Then a scored context whose CI lies wholly above the regression bar is resolved however wide: more
    pairs there could only raise the tier. An interval of fewer than MIN_DF degrees of freedom decides
    nothing (a tier, none, or a regression)."""
    floor = rules.tiers[0].lower_bound
    bar = rules.gates.no_regression.min_ratio
    earned = (
        best is not None
        and best.tier is not None
        and tracks.resolves(best, rules.tier(best.tier).lower_bound)
        and not _thin(best)
    )
    imprecise = [e for e in scored if _thin(e) or (e.mde > floor and not (earned and e.ci_low >= bar))]
    # a guard (a model measured and guarded, scored nowhere): its decode interval across the bar, too wide to
    # say it did not regress, leaves the verdict open as a scored context's would (noise is no licence)
    scoring = {e.model for e in scored}
    guards = [e for e in estimates if e.guarded and e.metric in DECODE_METRICS and e.model not in scoring
              and (_thin(e) or (e.mde > floor and e.ci_low < bar))]  # fmt: skip
    imprecise += [e for e in guards if e not in imprecise]
    return imprecise + [e for e in estimates if e.regression and e not in imprecise]


def _reject(
    rules: Rules,
    gates: list[Gate],
    failed: list[Gate],
    estimates: tuple[ContextEstimate, ...],
    best: ContextEstimate | None,
    mde: float | None,
    scores: tuple[TrackScore, ...] = (),
) -> Verdict:
    add = []
    kinds = {g.kind for g in failed}
    if GateKind.REGRESSION in kinds:
        add.append(rules.labels.regression)
    if kinds & {GateKind.ACCURACY, GateKind.DECODE_AUDIT}:
        add.append(rules.labels.accuracy_fail)
    if GateKind.SPEC in kinds:
        add.append(rules.labels.spec_fail)
    reasons = tuple(_failed_reason(g) for g in failed)
    return _verdict(
        rules,
        Status.REJECT,
        gates=tuple(gates),
        reasons=reasons,
        add=tuple(add),
        estimates=estimates,
        best=best,
        mde=mde,
        keep_tier=False,
        scores=scores,
    )


def _is_infra(f: Failure) -> bool:
    return f.side in (Side.BASE, Side.HARNESS) or f.stage in INFRA_STAGES


def _describe(f: Failure) -> str:
    who = {Side.BASE: "main", Side.HEAD: "the PR", Side.HARNESS: "the harness"}[f.side]
    return f"{f.stage} failed on {who}: {f.message}"


def _estimate(tp: ThroughputPairs, rules: Rules) -> ContextEstimate:
    est = stats.estimate_design(tp.pairs, tp.blocks, tp.base_first)
    cls = stats.classify(est, rules.tier_bounds, rules.gates.no_regression.min_ratio)
    bases = sorted(b for b, _ in tp.pairs)
    heads = sorted(h for _, h in tp.pairs)
    return ContextEstimate(
        model=tp.model,
        context=tp.context,
        metric=tp.metric,
        n=est.n,
        base_median=_median(bases),
        head_median=_median(heads),
        ratio=est.ratio,
        ci_low=est.ci_low,
        ci_high=est.ci_high,
        mde=est.mde,
        tier=cls.tier if tp.scored else None,
        regression=cls.regression and tp.guarded,
        guarded=tp.guarded,
        scored=tp.scored,
        df=est.df,
    )


def _signed(fraction: float) -> str:
    """A signed percentage, with two decimals below 1% (one would read "+0.0%")."""
    return f"{fraction:+.2%}" if abs(fraction) < 0.0095 else f"{fraction:+.1%}"


def _thin(e: ContextEstimate) -> bool:
    """An interval with too few degrees of freedom to decide anything (records before #40 kept none: as read)."""
    return e.df is not None and e.df < MIN_DF


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _throughput_gates(estimates: Iterable[ContextEstimate], rules: Rules) -> list[Gate]:
    bar = rules.gates.no_regression.min_ratio
    return [
        Gate(
            "no regression",
            e.ci_high,
            f"CI upper bound >= {bar:.2f}x main",
            not e.regression,
            f"{e.metric} {e.ratio:.3f}x [{e.ci_low:.3f}, {e.ci_high:.3f}]",
            e.context,
            e.model,
            GateKind.REGRESSION,
        )
        for e in estimates
        if e.guarded
    ]


def _failed_reason(g: Gate) -> str:
    where = f" at ctx {g.context}" if g.context is not None else ""
    value = f"{g.value:.4g}" if g.value is not None else "n/a"
    return f"{g.name}{where} failed: {value}, needs {g.bar}" + (f" ({g.detail})" if g.detail else "")


def _verdict(
    rules: Rules,
    status: Status,
    *,
    reasons: tuple[str, ...],
    gates: tuple[Gate, ...] = (),
    add: tuple[str, ...] = (),
    estimates: tuple[ContextEstimate, ...] = (),
    best: ContextEstimate | None = None,
    mde: float | None = None,
    keep_tier: bool = True,
    scores: tuple[TrackScore, ...] = (),
    tier: str | None = None,
) -> Verdict:
    tier = tier if tier is not None else (best.tier if (best and keep_tier) else None)
    return Verdict(
        status=status,
        tier=tier,
        scored_context=best.context if best else None,
        gates=gates,
        reasons=reasons,
        labels_add=tuple(add),
        estimates=estimates,
        rules_hash=rules.rules_hash,
        mde=mde,
        scores=scores,
    )
