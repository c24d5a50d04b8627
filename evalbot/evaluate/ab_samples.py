"""The A/B's data: one timed request (`Sample`), everything the runs produced (`Run`), one side's failure
(`SideError`), the fresh prompts handed out (`Prompts`), and the (main, PR) pairs read out of them per context and metric, as the verdict reads them
(`throughput`) and as the runs' estimates do (`estimates`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evalbot import stats
from evalbot.model import UTILIZATION_METRIC, Side, ThroughputPairs
from evalbot.rules import Profile


class SideError(RuntimeError):
    """One side's serving process failed; carries which side, the stage and the stderr tail."""

    def __init__(self, side: Side, stage: str, message: str, tail: str = ""):
        super().__init__(message)
        self.side, self.stage, self.tail = side, stage, tail


class BurstError(SideError):
    """A side's tokens were written together, at a rate no decode reaches: computed before the first was
    sent (the kernel stamps each write, `stamped`, so a reader the box kept waiting makes none). The pair is
    measured again (`forgive_burst`), up to BURSTS_FORGIVEN times a side in an evaluation."""


@dataclass(frozen=True)
class Sample:
    """One timed request: what was asked, what came back, and how long it took by the harness's clock."""

    side: Side
    context: int
    block: int
    pair: int
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    prefill_tps: float
    decode_tps: float
    reported: dict[str, Any]  # the engine's own timings (diagnostics only)
    reported_n: Any = None
    decode_s: float = 0.0  # wall, first token to last
    decode_cpu_s: float | None = None  # the tree's CPU time over the same interval
    prefill_cpu_s: float | None = None
    steal_ticks: int = 0
    switches: tuple[int, int] = (0, 0)
    base_first: bool = True  # main's process of this block was loaded first
    went_first: bool = True  # this side was timed first in its pair
    decode_steps: int | None = None  # steps in decode_s (tokens - 1 when clocked from the first token)

    @property
    def decode_cpu_tps(self) -> float | None:
        """Tokens per CPU-second of the tree, first token to last (None where not metered)."""
        if self.decode_cpu_s is None or self.decode_cpu_s <= 0:
            return None
        steps = self.decode_steps if self.decode_steps is not None else len(self.tokens) - 1
        return steps / self.decode_cpu_s

    @property
    def self_report_gap(self) -> float | None:
        """How far the engine's own decode time is from the harness's (a fraction; None if not given)."""
        d = self.reported.get("decode_s")
        if not isinstance(d, (int, float)) or d <= 0 or self.decode_tps <= 0:
            return None
        harness_decode_s = self.decode_s or (len(self.tokens) - 1) / self.decode_tps
        return abs(d - harness_decode_s) / harness_decode_s if harness_decode_s > 0 else None


@dataclass
class Prompts:
    """Fresh prompts, one per pair: token ids of exactly `ctx` tokens, never handed out twice."""

    source: Callable[[int, int], list[int]]  # (ctx, serial) -> ids
    served: int = 0

    def next(self, ctx: int) -> list[int]:
        self.served += 1
        return self.source(ctx, self.served)


@dataclass
class Run:
    """Everything the A/B runs produced."""

    samples: list[Sample] = field(default_factory=list)
    blocks: int = 0
    ready: dict[str, dict[str, Any]] = field(default_factory=dict)  # side -> the last ready line
    box_samples: list[dict[str, Any]] = field(default_factory=list)
    two_part: bool | None = None  # requests timed as a prefill and a continuation (main answers 'prefill')
    # tokens a timed request asks for, per context (measurement.decode_s: from main's rate in the first
    # block; otherwise decode_tokens everywhere)
    gen: dict[int, int] = field(default_factory=dict)
    bursts: dict[Side, int] = field(default_factory=dict)  # per side: pairs measured again after a burst
    min_blocks: int = 0  # the design's (`ab_design.design`, set by `abtest.measure`): the spec runs' hosts


# Bursts a side may have in one evaluation, each measured again, before the next is its failure. A burst's
# pair or spec run is discarded and measured again (on a fresh prompt where it is a pair). Until the kernel
# stamped each write (2026-12-07), a loaded 2-core box kept the reader thread waiting and an honest fast
# engine's answer read as one burst (twice in one fixture evaluation; the cause of two red CI runs). With
# the stamps a burst is the engine's own; the allowance stays as a margin. Main is trusted: up to 3. The
# PR's one: an engine that bursts on purpose could choose which pair to drop (one it expects to be slow, by
# its own prefill time), so it may drop one pair of an evaluation's 12 or more.
BURSTS_FORGIVEN = {Side.BASE: 3, Side.HEAD: 1}


def forgive_burst(run: Run, exc: BurstError, log: Callable[[str], None], what: str) -> None:
    """A side's first BURSTS_FORGIVEN bursts in an evaluation are measured again (logged, with what `what`
    was); the next one is raised."""
    run.bursts[exc.side] = run.bursts.get(exc.side, 0) + 1
    allowed = BURSTS_FORGIVEN.get(exc.side, 0)
    if run.bursts[exc.side] > allowed:
        raise exc
    log(f"{what} measured again: {exc} ({run.bursts[exc.side]} of the {allowed} this side may have)")


def estimates(samples: list[Sample], ctx: int, metric: str = "decode") -> stats.PairedEstimate | None:
    pairs, blocks, base_first = pairs_at(samples, ctx, metric)
    if len(set(blocks)) < 2:
        return None
    return stats.estimate_design(pairs, blocks, base_first)


METRICS = ("decode", "decode_cpu", "utilization", "prefill")


def _value(s: Sample, metric: str) -> float | None:
    if metric == "utilization":  # CPU seconds per wall second over the decode
        return s.decode_cpu_s / s.decode_s if s.decode_cpu_s and s.decode_s > 0 else None
    return {"decode": s.decode_tps, "decode_cpu": s.decode_cpu_tps, "prefill": s.prefill_tps}[metric]


def pairs_at(
    samples: list[Sample], ctx: int, metric: str
) -> tuple[list[tuple[float, float]], list[int], list[bool]]:
    """(base, head) pairs of one metric at one context, with each pair's block and its load order; a pair
    either side of which lacks the metric (an unmetered CPU clock) is left out."""
    by_key: dict[tuple[int, int], dict[Side, Sample]] = {}
    for s in samples:
        if s.context == ctx:
            by_key.setdefault((s.block, s.pair), {})[s.side] = s
    pairs, blocks, base_first = [], [], []
    for (block, _), sides in sorted(by_key.items()):
        if Side.BASE in sides and Side.HEAD in sides:
            b, h = _value(sides[Side.BASE], metric), _value(sides[Side.HEAD], metric)
            if b is None or h is None:
                continue
            pairs.append((b, h))
            blocks.append(block)
            base_first.append(sides[Side.BASE].base_first)
    return pairs, blocks, base_first


def throughput(samples: list[Sample], profile: Profile, model: str) -> list[ThroughputPairs]:
    """Decode (wall and CPU clock) and prefill pairs per context, as the verdict reads them: blocks are
    the clusters and their load orders the crossover; the verdict decides which decode clock scores. On a
    GPU the CPU clock is shown and never scores: the engine's host CPU time measures its host thread
    waiting on the device, not the device's speed (an A/A run on an H100, 2026-12-06: MDE 0.05-0.12% on
    the wall clock, 0.17-0.36% on the CPU clock, docs/benchmarks.md #40)."""
    out = []
    cpu_scores = profile.device != "cuda"
    for c in profile.contexts:
        for metric, name, scored in (
            ("decode", "decode_tps", c.scored),
            ("decode_cpu", "decode_cpu_tps", c.scored and cpu_scores),
            ("utilization", UTILIZATION_METRIC, False),
            ("prefill", "prefill_tps", False),
        ):
            pairs, blocks, base_first = pairs_at(samples, c.ctx, metric)
            if metric in ("decode_cpu", "utilization") and len(pairs) < 2:
                continue  # not metered here
            out.append(
                ThroughputPairs(
                    model,
                    c.ctx,
                    name,
                    tuple(pairs),
                    guarded=c.guarded and metric != "utilization",
                    scored=scored,
                    blocks=tuple(blocks),
                    base_first=tuple(base_first),
                )
            )
    return out
