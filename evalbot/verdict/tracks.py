"""Scored tracks (tracks.yaml) -> a score per track and model. Pure.

The decode track decides which (model, context) estimates are scored: a model is scored only at its own
contexts, and every measured model stays guarded wherever its profile guards (a regression on a model the
PR does not target still rejects it). A speculative track scores the speculative rate that the spec runs
measured on the harness's clock; its gates (lossless, tau against main, plain decode as a floor) are the
spec gates, a REJECT when they fail. A tier stands only where the interval resolves it (`resolves`: its MDE at
most the tier's floor, or its lower bound an MDE past it; enough degrees of freedom); otherwise the score
names the tier it cannot yet give.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from evalbot import stats
from evalbot.model import DECODE_METRICS, ContextEstimate, SpecResult, TrackScore
from evalbot.rules import DECODE_TRACK, SPEC_TRACK, Rules, Track, TrackModel

SPEC_METRIC = "spec_tps"
MIN_DF = 2  # fewer degrees of freedom decide nothing (why: verdict.decide, above its MIN_DF)


def decode_scored(
    estimates: Sequence[ContextEstimate], rules: Rules, profile: str
) -> tuple[ContextEstimate, ...]:
    """The estimates with `scored` only where a decode track of tracks.yaml scores that model at that context;
    as measured (profiles.yaml's flags) where no decode track names the profile."""
    named = [t for t in rules.tracks_for(profile) if t.metric == DECODE_TRACK and not t.implicit]
    if not named:
        return tuple(estimates)
    contexts: dict[str, set[int]] = {}
    for t in named:
        for e in t.models:
            contexts.setdefault(e.model, set()).update(e.contexts)
    return tuple(
        e if (e.context in contexts.get(e.model, ())) or not e.scored
        else dataclasses.replace(e, scored=False, tier=None)
        for e in estimates
    )  # fmt: skip


def spec_estimates(spec: Iterable[SpecResult], rules: Rules) -> tuple[ContextEstimate, ...]:
    """The speculative rate, PR against main, per (target, context) the spec runs measured (two runs at least)."""
    out = []
    for s in spec:
        if len(s.spec_pairs) < 2 or s.context is None:
            continue
        try:
            # each run its own prompt; runs in one block share its processes' offset (`estimate_clustered`)
            est = (stats.estimate_clustered(s.spec_pairs, s.spec_blocks) if len(s.spec_blocks) == len(s.spec_pairs)
                   else stats.estimate(s.spec_pairs))  # fmt: skip
            cls = stats.classify(est, rules.tier_bounds, rules.gates.no_regression.min_ratio)
        except stats.StatsError:
            continue
        bases = sorted(b for b, _ in s.spec_pairs)
        heads = sorted(h for _, h in s.spec_pairs)
        out.append(ContextEstimate(
            model=s.target, context=s.context, metric=SPEC_METRIC, n=est.n, base_median=_median(bases),
            head_median=_median(heads), ratio=est.ratio, ci_low=est.ci_low, ci_high=est.ci_high, mde=est.mde,
            tier=cls.tier, regression=False, guarded=False, scored=True, df=est.df,
        ))  # fmt: skip
    return tuple(out)


def track_scores(
    estimates: Sequence[ContextEstimate], spec: Sequence[ContextEstimate], rules: Rules, profile: str
) -> tuple[TrackScore, ...]:
    """One score per track and scored model of this profile, in the rules' order."""
    out = []
    for t in rules.tracks_for(profile):
        pool = spec if t.metric == SPEC_TRACK else [e for e in estimates if e.metric in DECODE_METRICS]
        entries = t.models
        if t.implicit:  # profiles.yaml's scoring, for every model measured (whatever the rules call them)
            ctxs = tuple(sorted({e.context for e in pool if e.scored}))
            entries = tuple(TrackModel(profile, m, ctxs) for m in dict.fromkeys(e.model for e in pool))
        for entry in entries:
            if entry.guard:
                continue
            out.append(_score(t, entry, [e for e in pool if e.model == entry.model and e.scored
                                         and e.context in entry.contexts], rules))  # fmt: skip
    return tuple(out)


def _score(t: Track, entry: TrackModel, here: list[ContextEstimate], rules: Rules) -> TrackScore:
    if not here:  # not measured (speculative decoding not run): no label either way
        return TrackScore(t.name, t.metric, entry.model, None, None, None, "not measured", t.overall)
    bounds = rules.track_bounds(t)
    if t.tiers:  # the track's own floors: each estimate's tier from its lower bound against them
        here = [dataclasses.replace(e, tier=_earned(e, bounds)) for e in here]
    best = max(here, key=lambda e: (rules.tier_rank(e.tier), e.ci_low))
    tier, note = resolved_tier(best, rules, bounds)
    return TrackScore(t.name, t.metric, entry.model, tier, entry.label_for(tier), best, note, t.overall)


def _earned(e: ContextEstimate, bounds: Sequence[tuple[str, float]]) -> str | None:
    """The highest tier whose floor the estimate's CI lower bound reaches (as `stats.classify`)."""
    return max(((b, n) for n, b in bounds if e.ci_low - 1.0 >= b), default=(0.0, None))[1]


def resolved_tier(
    e: ContextEstimate, rules: Rules, bounds: Sequence[tuple[str, float]] | None = None
) -> tuple[str | None, str]:
    """The highest tier the estimate both earned (its CI's lower bound) and resolves (`resolves`, against the
    tier's floor: tiers.yaml's, or the track's `bounds`), and a note where that is less than its lower
    bound alone would give."""
    if e.df is not None and e.df < MIN_DF:
        return None, f"{e.n} runs: too few to decide a tier"
    floors = tuple(bounds) if bounds is not None else rules.tier_bounds
    earned = rules.tier_rank(e.tier)
    for name, floor in reversed(floors[:earned]):
        if resolves(e, floor):
            return name, "" if name == e.tier else f"{e.tier} held back to {name}: MDE {e.mde:.1%}"
    if e.tier is not None:
        return None, (
            f"{e.tier} held back: MDE {e.mde:.1%}, above {floors[0][0]}'s floor, and the CI's lower bound not "
            f"an MDE past any floor it reached"
        )
    return None, ""


def resolves(e: ContextEstimate, floor: float) -> bool:
    """Whether an estimate whose CI's lower bound reached a tier's floor resolves that tier: its MDE at most
    the floor, or its lower bound past the floor by an MDE's worth ((1 + floor) * (1 + MDE)), the mirror of a
    proven regression's rule (`decide._proven_regression`). Either way equal code, or a true gain below the
    floor, reads that high only where its t statistic clears the interval's quantile and an MDE's worth
    more: as rarely as `decide.MIN_DF`'s note says. The second arm decides a gain far larger than its noise
    (+114% [+71%, +168%] at an MDE of 37%: the lower bound alone proves XL), where the first held it back."""
    return e.mde <= floor or e.ci_low >= (1.0 + floor) * (1.0 + e.mde)


def overall(scores: Iterable[TrackScore], rules: Rules) -> TrackScore | None:
    """The best score of the tracks that count toward the overall tier (None where none earned a tier)."""
    counted = [s for s in scores if s.overall and s.tier is not None and s.estimate is not None]
    return max(counted, key=lambda s: (rules.tier_rank(s.tier), s.estimate.ci_low if s.estimate else 0),
               default=None)  # fmt: skip


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


__all__ = [
    "SPEC_METRIC",
    "decode_scored",
    "overall",
    "resolved_tier",
    "resolves",
    "spec_estimates",
    "track_scores",
]
