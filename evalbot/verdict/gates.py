"""The correctness gates -> Gates: the decode audit (each audit's bar against main's own share), accuracy
against llama.cpp, and speculative decoding (lossless runs, tau's bound, the AR speed). Pure: a function of
the measured results and Rules, no I/O; `decide` reads them for its REJECT.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from evalbot import stats
from evalbot.model import AccuracyResult, DecodeAudit, Gate, GateKind, Side, SpecResult
from evalbot.rules import Rules


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
    own = [b.share for b in audits if b.side is Side.BASE and (b.model, b.context) == (a.model, a.context)]
    return min(g.top1_min, own[0] - g.self_drop_max) if own else g.top1_min


def audit_passes(a: DecodeAudit, bar: float) -> bool:
    return a.share >= bar and a.violations == 0


def audit_gates(audits: Sequence[DecodeAudit], rules: Rules) -> list[Gate]:
    g = rules.gates.decode_audit
    out = []
    for a in audits:
        if a.side is not Side.HEAD:
            continue
        bar = audit_bar(a, audits, rules)
        worst = a.worst[0] if a.worst else None
        detail = (
            f"{a.agreeing} of {a.tokens} generated tokens in {a.requests} requests are {a.reference}'s top-1"
            f", {a.near_ties} near-ties"
        )
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
                f">= {bar:.2f} top-1{against}, the rest near-ties",
                audit_passes(a, bar),
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


def spec_gates(results: Iterable[SpecResult], rules: Rules) -> list[Gate]:
    g = rules.gates.spec
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
            est = stats.estimate(s.ar_pairs)
            out.append(
                Gate(
                    "spec AR speed",
                    est.ci_high,
                    f"CI upper bound >= {g.ar_speed_min_ratio:.2f}x main",
                    est.ci_high >= g.ar_speed_min_ratio,
                    f"AR {est.ratio:.3f}x",
                    s.context,
                    s.target,
                    GateKind.SPEC,
                )
            )
    return out
