"""The correctness gates -> Gates: the decode audit (each audit's bar against main's own share), accuracy
against llama.cpp, and speculative decoding (lossless runs, tau's bound, the AR speed). Pure: a function of
the measured results and Rules, no I/O; `decide` reads them for its REJECT.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from evalbot import stats
from evalbot.model import AccuracyResult, ContextEstimate, DecodeAudit, Gate, GateKind, Side, SpecResult
from evalbot.rules import Rules
from evalbot.verdict.tracks import MIN_DF, spec_estimates


def audit_bar(a: DecodeAudit, audits: Sequence[DecodeAudit], rules: Rules) -> float:
    """The top-1 share an audit must reach: the rules' top1_min, or where main's own decode falls short of
    it (bf16 against itself, or an engine whose numerics differ from llama.cpp's), main's own share less
    self_drop_max; main itself must reach self_top1_min. Every disagreement must be a near-tie either way.

    Found by the cpu profile's A/A calibration: main agreed with llama.cpp on 94.8% of 384 decoded tokens of
    the real Q4_K_M model, every other one a near-tie, and an absolute 95% bar turned that into an
    INFRA_ERROR for identical code."""
    g = rules.gates.decode_audit
    if a.side is Side.BASE:
        return min(g.top1_min, g.self_top1_min)
    own = _main_audit(a, audits)
    return min(g.top1_min, own.share - g.self_drop_max) if own else g.top1_min


def _main_audit(a: DecodeAudit, audits: Sequence[DecodeAudit]) -> DecodeAudit | None:
    return next(
        (b for b in audits if b.side is Side.BASE and (b.model, b.context) == (a.model, a.context)), None
    )


def wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval of a share k/n at normal quantile z; (0, 1) for no tokens."""
    if n <= 0:
        return 0.0, 1.0
    p, zz = k / n, z * z / n
    centre = (p + zz / 2) / (1 + zz)
    half = z * math.sqrt(p * (1 - p) / n + zz / (4 * n)) / (1 + zz)
    return max(0.0, centre - half), min(1.0, centre + half)


def share_difference(k1: int, n1: int, k2: int, n2: int, z: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval of k1/n1 - k2/n2 (his method 10, from the two Wilson intervals): it
    keeps its coverage near a share of 1, where the normal one does not (main agrees on nearly every token)."""
    p1, p2 = k1 / max(n1, 1), k2 / max(n2, 1)
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)


PASS, FAIL, OPEN = "pass", "fail", "open"


def _quantile(confidence: float) -> float:
    """The normal quantile of a two-sided interval of this confidence (1.96 at 0.95)."""
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def audit_call(a: DecodeAudit, audits: Sequence[DecodeAudit], rules: Rules) -> str:
    """Whether an audit passes (PASS), fails (FAIL), or its tokens cannot tell (OPEN, which passes once
    every timed request has been audited: `served_model` widens an open audit first).

    A disagreement beyond a near-tie fails at once, unless the rules set max_gap: then only one past it
    does, and the head's tokens past a near-tie (up to max_gap) fail where they are confidently more
    frequent than main's (the interval of the two shares' difference, as below); while the tokens cannot
    tell, the audit is OPEN (widened). Main (trusted) is held to its bar by its share. The
    head fails on its share only where the rules' confidence interval lies wholly below both bars: the
    absolute top1_min, and main's own share less self_drop_max (the interval of the head's share less
    main's, from both audits' tokens). A few requests' tokens tell little: 127 of 136 tokens (every other
    one a near-tie) against main's 135 of 136 is a drop of 5.9 points by the counts, and anything from 1
    to 10 by the interval; `make demo`'s int8 PR was rejected on such counts (2026-12-07)."""
    g = rules.gates.decode_audit
    if a.tokens <= 0 or not 0 <= a.agreeing + a.near_ties + a.violations <= a.tokens:
        return FAIL  # no tokens, or counts that do not add up: nothing to pass on
    if a.violations and (g.max_gap is None or not _within(a.worst, g.max_gap)):
        return FAIL
    if a.side is Side.BASE:
        return PASS if a.share >= audit_bar(a, audits, rules) else FAIL
    z = _quantile(g.confidence)
    own = _main_audit(a, audits)
    flips = OPEN if a.violations else PASS  # past near_tie, none past max_gap: as rare as main's?
    if a.violations:
        if own is None:
            return FAIL
        _, dhi = share_difference(
            a.tokens - a.violations, a.tokens, own.tokens - own.violations, own.tokens, z
        )
        if dhi < -g.flip_rate_max:  # confidently more often past a near-tie than main's, by more than allowed
            return FAIL
    lo, hi = wilson(a.agreeing, a.tokens, z)
    if lo >= g.top1_min:
        return flips
    if own is None:
        return FAIL if hi < g.top1_min else OPEN
    dlo, dhi = share_difference(a.agreeing, a.tokens, own.agreeing, own.tokens, z)
    if dlo >= -g.self_drop_max:
        return flips
    return FAIL if hi < g.top1_min and dhi < -g.self_drop_max else OPEN


def _within(worst: Sequence[dict[str, object]], max_gap: float) -> bool:
    """Every listed flip's gap a finite number at most max_gap (none listed: nothing to weigh, so no)."""
    gaps = [w.get("margin") for w in worst]
    return bool(gaps) and all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x <= max_gap
        for x in gaps
    )


def audits_open(audits: Sequence[DecodeAudit], rules: Rules) -> set[int]:
    """The contexts where the head's audit cannot tell yet (OPEN): widen them to every timed request."""
    return {a.context for a in audits if a.side is Side.HEAD and audit_call(a, audits, rules) == OPEN}


def audit_passes(a: DecodeAudit, audits: Sequence[DecodeAudit], rules: Rules) -> bool:
    return audit_call(a, audits, rules) != FAIL


def audit_gates(audits: Sequence[DecodeAudit], rules: Rules) -> list[Gate]:
    g = rules.gates.decode_audit
    z = _quantile(g.confidence)
    out = []
    for a in audits:
        if a.side is not Side.HEAD:
            continue
        bar = audit_bar(a, audits, rules)
        worst = a.worst[0] if a.worst else None
        lo, hi = wilson(a.agreeing, a.tokens, z)
        detail = (
            f"{a.agreeing} of {a.tokens} generated tokens in {a.requests} requests are {a.reference}'s top-1"
            f" ({g.confidence:.0%} interval {lo:.3f}-{hi:.3f}), {a.near_ties} near-ties"
        )
        own = _main_audit(a, audits)
        if own is not None and own.tokens:
            dlo, dhi = share_difference(a.agreeing, a.tokens, own.agreeing, own.tokens, z)
            detail += f"; main's {own.agreeing} of {own.tokens}: a change of {dlo:+.3f} to {dhi:+.3f}"
        if worst:
            detail += (
                f"; {a.violations} not near-ties, the worst at {worst['request']} position {worst['position']}"
                f" (margin {worst['margin']:.2f} below the top-1 >= {g.near_tie:g})"
            )
        against = "" if bar >= g.top1_min else " (main's own share less the allowed drop)"
        out.append(
            Gate(
                "decode agreement",
                a.share,
                f">= {bar:.2f} top-1{against} unless its {g.confidence:.0%} interval reaches it, the rest"
                " near-ties"
                + (
                    f" (or within {g.max_gap:g}, at most {g.flip_rate_max:.0%} of the tokens more often than main's)"
                    if g.max_gap is not None
                    else ""
                ),
                audit_passes(a, audits, rules),
                detail,
                a.context,
                a.model,
                GateKind.DECODE_AUDIT,
            )
        )
    return out


def accuracy_gates(results: Iterable[AccuracyResult], rules: Rules) -> list[Gate]:
    g = rules.gates.accuracy
    out = []
    for a in results:
        out.append(
            Gate(
                "accuracy top-1",
                a.top1_agreement,
                f">= {g.top1_min:.2f} vs {a.reference}",
                a.top1_agreement >= g.top1_min,
                f"{a.positions} positions",
                model=a.model,
                kind=GateKind.ACCURACY,
            )
        )
        out.append(
            Gate(
                "accuracy KL",
                a.kl_mean,
                f"mean KL <= {g.mean_kl_max:.2f}",
                a.kl_mean <= g.mean_kl_max,
                f"PPL ratio {a.ppl_ratio:.4f}",
                model=a.model,
                kind=GateKind.ACCURACY,
            )
        )
    return out


def tau_ratio_upper(base_steps: Sequence[int], head_steps: Sequence[int]) -> float | None:
    """The 95% upper bound of head's over main's mean tokens per verify step, from every step's count
    (delta method on the log ratio); None with fewer than two steps a side.

    The PR's outputs may differ from main's (int8 weights, another kernel's rounding), and an n-gram
    drafter's acceptance follows the text: three runs of main moved tau from 1.05 to 1.92 on one box. A
    point estimate against a 5% bar then rejects a lossless PR on the text it happened to write; the
    bound rejects a tau that is lower beyond that spread (a drafter that never hits: every step 1 token)."""
    if len(base_steps) < 2 or len(head_steps) < 2:
        return None
    mb, mh = statistics.fmean(base_steps), statistics.fmean(head_steps)
    if mb <= 0 or mh <= 0:
        return 0.0
    sb = statistics.stdev(base_steps) / math.sqrt(len(base_steps))
    sh = statistics.stdev(head_steps) / math.sqrt(len(head_steps))
    return (mh / mb) * math.exp(1.96 * math.sqrt((sh / mh) ** 2 + (sb / mb) ** 2))


def spec_slowdown_proven(e: ContextEstimate, rules: Rules) -> bool:
    """The speculative rate's interval wholly below the regression bar, and at least an MDE below 1: the
    mirror of a decode regression's rule (`decide._proven_regression`). A slowdown its runs cannot resolve
    (the spec rate's MDE was 8-20% on the real 0.5B) decides nothing: equal code reads a CI below the bar
    in 2.5% of runs."""
    return _resolved_below(e.ci_high, e.mde, e.df, rules.gates.no_regression.min_ratio)


def _resolved_below(ci_high: float, mde: float, df: int | None, bar: float) -> bool:
    """A slowdown an interval resolves: its upper bound below the bar, at least an MDE below 1, from at least
    MIN_DF degrees of freedom (the spec rate and the spec runs' AR speed alike)."""
    return ci_high < bar and ci_high * (1.0 + mde) <= 1.0 and (df is None or df >= MIN_DF)


def _ar_slowdown_proven(est: stats.PairedEstimate, bar: float) -> bool:
    return _resolved_below(est.ci_high, est.mde, est.df, bar)


def spec_unresolved(results: Iterable[SpecResult], rules: Rules) -> list[ContextEstimate]:
    """The speculative rates and the spec runs' AR speeds whose interval lies below the regression bar but
    not by an MDE: a slowdown too imprecise to call, which `decide` measures again (INCONCLUSIVE), as it does
    a decode context's. Passing it instead let a PR hide a slower verify behind noise of its own making (a
    0.673x spec rate at an MDE of 34% collected a decode tier; found by review, 2026-12-07)."""
    results = list(results)
    least = rules.gates.no_regression.min_ratio
    out = [
        e for e in spec_estimates(results, rules) if e.ci_high < least and not spec_slowdown_proven(e, rules)
    ]
    bar = rules.gates.spec.ar_speed_min_ratio
    for s in results:
        if len(s.ar_pairs) < 2 or s.context is None:
            continue
        est = stats.estimate(s.ar_pairs)
        if est.ci_high < bar and not _ar_slowdown_proven(est, bar):
            out.append(ContextEstimate(
                model=s.target, context=s.context, metric="spec_ar_tps", n=est.n,
                base_median=statistics.median(b for b, _ in s.ar_pairs),
                head_median=statistics.median(h for _, h in s.ar_pairs), ratio=est.ratio, ci_low=est.ci_low,
                ci_high=est.ci_high, mde=est.mde, tier=None, regression=True, guarded=True, scored=False,
                df=est.df,
            ))  # fmt: skip
    return out


def spec_gates(results: Iterable[SpecResult], rules: Rules) -> list[Gate]:
    g = rules.gates.spec
    results = list(results)
    rates: dict[tuple[str, int | None], ContextEstimate] = {
        (e.model, e.context): e for e in spec_estimates(results, rules)
    }
    out = []
    for s in results:
        detail = "" if s.first_divergence is None else f"first divergence at token {s.first_divergence}"
        # a speculative track may run more than gates.spec.runs: the runs allowed to differ stay as few
        need = max(s.runs - (g.runs - g.lossless_runs_min), g.lossless_runs_min)
        out.append(
            Gate(
                "spec lossless",
                float(s.lossless_runs),
                f">= {need} of {s.runs} runs",
                s.lossless_runs >= need,
                detail,
                s.context,
                s.target,
                GateKind.SPEC,
            )
        )
        ratio = s.head_tau / s.base_tau if s.base_tau > 0 else 0.0
        upper = tau_ratio_upper(s.base_tau_steps, s.head_tau_steps)
        detail = f"tau {s.head_tau:.2f} vs main {s.base_tau:.2f}"
        if upper is None:  # no per-step record (an older result): the point estimate decides, as it did
            value, bar = ratio, f"tau >= {g.tau_min_ratio:.2f}x main"
        else:
            value, bar = upper, f"CI upper bound of tau >= {g.tau_min_ratio:.2f}x main"
            detail += f" ({ratio:.3f}x)"
        out.append(
            Gate("spec tau", value, bar, value >= g.tau_min_ratio, detail, s.context, s.target, GateKind.SPEC)
        )
        if len(s.ar_pairs) >= 2:
            # called as a decode regression is: the bound below the bar, by an MDE (a noisy box's AR pairs
            # read a bare bound below 0.98 on equal code now and then)
            est = stats.estimate(s.ar_pairs)
            slower = _ar_slowdown_proven(est, g.ar_speed_min_ratio)
            out.append(
                Gate(
                    "spec AR speed",
                    est.ci_high,
                    f"CI upper bound >= {g.ar_speed_min_ratio:.2f}x main or within an MDE of 1",
                    not slower,
                    f"AR {est.ratio:.3f}x, MDE {est.mde:.1%}",
                    s.context,
                    s.target,
                    GateKind.SPEC,
                )
            )
        # speculative decoding made slower (at equal tau and AR speed, too) is a regression
        rate = rates.get((s.target, s.context))
        if rate is not None:
            least = rules.gates.no_regression.min_ratio
            out.append(
                Gate(
                    "spec speed",
                    rate.ci_high,
                    f"no resolved slowdown: CI upper bound >= {least:.2f}x main or within an MDE of 1",
                    not spec_slowdown_proven(rate, rules),
                    f"spec {rate.ratio:.3f}x [{rate.ci_low:.3f}, {rate.ci_high:.3f}], MDE {rate.mde:.1%}",
                    s.context,
                    s.target,
                    GateKind.SPEC,
                )
            )
    return out
