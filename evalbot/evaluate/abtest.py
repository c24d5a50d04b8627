"""The A/B measurement: warm serving processes in blocks, requests interleaved, the harness's clock.

An evaluation runs an even number of process blocks. Each block starts a fresh serving process per side
(loaded and warmed once), then times an even number of pairs of requests at every context, each side
going first in half of them. Every request gets a prompt no process has seen before (no prefix caching
on the benchmark). While one side is timed the other is frozen. Between blocks the processes are
replaced, so process-level variance (memory layout, allocator state) is in the data.

The blocks are a crossover: even blocks load main first, odd ones the PR. On a 2-core VM the process
loaded second decoded about 1% faster (the probe in docs/benchmarks.md), which made identical code look
faster at every context; alternating the order and estimating with the order as a factor
(`stats.crossover`) cancels it and keeps it out of the interval. Pairs go to the contexts whose pairs
vary most (`allocate`), and the runs stop as soon as no further pair could change the decision.

Where main's engine answers the `prefill` op (its ready line lists it), each request goes in two parts:
the prompt as a prefill, which answers no token, then a continuation of one token the harness draws only
once both sides' prefills have answered, with the tokens to decode. Decode is clocked from sending the
continuation to the last token: every decode step depends on that token, so none can be done before the
clock starts, where a one-part request lets an engine compute decode steps before its first token line
and have them scored as prefill (#36). The PR's engine must then answer `prefill` too.

Each request is clocked twice by the harness: wall time (timestamps of the streamed lines) and the CPU
time of the engine's whole process tree (`cpumeter`), with the box's steal and the tree's context
switches, for the verdict's choice of clock and the variance breakdown (bench/variance_breakdown.py).

The box must stay quiet: before every block the harness waits for it, and a pair during which another
process used the CPU is measured again.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from evalbot import stats
from evalbot.evaluate import box, served
from evalbot.evaluate.served import ServedProcess, ServeError, Timed, run_alone
from evalbot.model import UTILIZATION_METRIC, Side, ThroughputPairs
from evalbot.rules import Profile, Quiet

Launch = Callable[[Side], ServedProcess]
Log = Callable[[str], None]
CONTAMINATED_RETRIES = 3


class SideError(RuntimeError):
    """One side's serving process failed; carries which side, the stage and the stderr tail."""

    def __init__(self, side: Side, stage: str, message: str, tail: str = ""):
        super().__init__(message)
        self.side, self.stage, self.tail = side, stage, tail


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


def _estimates(samples: list[Sample], ctx: int, metric: str = "decode") -> stats.PairedEstimate | None:
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


def allocate(
    samples: list[Sample], contexts: list[int], per_context: int, cap: int | None = None
) -> dict[int, int]:
    """Pairs per context in the next block: `per_context` each at first, then the block's total shared in
    proportion to each context's pair variance (the noisier context gets more), each an even number >= 2
    so both sides go first equally often; with a `cap`, never past `cap` pairs at a context in all."""
    counts = _share(samples, contexts, per_context)
    if cap is None:
        return counts
    return {c: min(n, max(cap - len(pairs_at(samples, c, "decode")[0]), 0)) for c, n in counts.items()}


def _share(samples: list[Sample], contexts: list[int], per_context: int) -> dict[int, int]:
    if per_context == 1:  # one pair a context a block: its order alternates across blocks, nothing to share
        return {c: 1 for c in contexts}
    total = per_context * len(contexts)
    var: dict[int, float] = {}
    for ctx in contexts:
        pairs, _, _ = pairs_at(samples, ctx, "decode")
        if len(pairs) < 4:
            return {c: per_context for c in contexts}
        d = [math.log(h / b) for b, h in pairs]
        mean = sum(d) / len(d)
        var[ctx] = max(sum((x - mean) ** 2 for x in d) / (len(d) - 1), 1e-12)
    weight = sum(var.values())
    return {c: max(2, 2 * round(total * var[c] / weight / 2)) for c in contexts}


def design(pairs_per_block: int, min_blocks: int, cap: int) -> tuple[int, int, int]:
    """(pairs per context per block, most blocks, fewest blocks) for a pair cap per context. A block's
    pairs are even (ABBA within it) but few enough that the cap still buys 4 blocks (the smallest
    crossover, 2 of each load order: 2 blocks leave 1 degree of freedom), one where the cap is that tight
    or where one is asked for (the pair order then alternates across the blocks, with the load order);
    blocks come in whole crossovers, and never more pairs than the cap (2 at the least)."""
    asked = 1 if pairs_per_block <= 1 else 2 * math.ceil(pairs_per_block / 2)
    per_block = max(1, min(asked, 2 * (cap // 8) or cap // 4))
    most = max(2, 2 * (cap // (2 * per_block)))
    return per_block, most, max(2, min(2 * math.ceil(min_blocks / 2), most))


Progress = Callable[[dict[str, Any]], None]


Decided = Callable[[list["Sample"]], bool]


def measure(
    profile: Profile,
    launch: Launch,
    prompts: Prompts,
    log: Log,
    *,
    max_pairs: int | None = None,
    request_timeout_s: float = 600.0,
    ready_timeout_s: float = 900.0,
    quiet: Quiet | None = None,
    progress: Progress | None = None,
    decided: Decided | None = None,
    settled: Callable[[dict[Side, ServedProcess]], None] | None = None,
) -> tuple[Run, dict[Side, ServedProcess]]:
    """Run pairs of blocks (the crossover: each load order once) until every scored context's CI is narrow
    enough or `decided` says no further pair could change the verdict, or the pair cap, or the time budget.
    `settled` is called in every block once both processes are ready and warmed, frozen, before the first
    timed request. The last block's processes are returned still running (frozen), for the audit and the
    spec runs: the caller closes them."""
    m = profile.measurement
    quiet = quiet or profile.quiet
    cap = max_pairs or m.max_pairs
    per_block, max_blocks, min_blocks = design(m.pairs_per_block, m.min_blocks, cap)
    gpu = profile.device == "cuda"
    contexts = [c.ctx for c in profile.contexts]
    run = Run()
    start = time.monotonic()
    while True:
        block = run.blocks
        before, waited = box.wait_until_quiet(quiet, with_gpu=gpu, log=log)
        run.box_samples.append(
            {"block": block + 1, "waited_s": round(waited, 1), **before.as_record(), **box.state()}
        )
        base_first = block % 2 == 0
        procs = _start_block(launch, ready_timeout_s, log, base_first, m.start == "parallel", m.threads)
        run.ready = {s.value: p.ready for s, p in procs.items()}
        counts = allocate(run.samples, contexts, per_block, cap)
        try:
            two = two_part(procs)
            if run.two_part is None:
                run.two_part = two
                if not two:
                    log(
                        "main's engine answers no 'prefill' op: each request is timed in one part, and an "
                        "engine could compute decode steps before its first token (the report says so)"
                    )
            if m.warm_requests:
                warm(
                    procs,
                    contexts,
                    prompts,
                    m.decode_tokens,
                    request_timeout_s,
                    m.stream,
                    m.warm_requests,
                    two,
                )
            if settled is not None:
                settled(procs)
            for c in profile.contexts:
                for i in range(counts[c.ctx]):
                    pair = _pair(
                        procs,
                        block,
                        i,
                        c.ctx,
                        prompts,
                        m.decode_tokens,
                        request_timeout_s,
                        quiet,
                        gpu,
                        log,
                        run,
                        base_first,
                        m.stream,
                        m.slice_s,
                        two,
                    )
                    for one in pair:
                        why_cpu = request_overuse(one, m.threads)
                        if why_cpu:
                            who = "main's" if one.side is Side.BASE else "the PR's"
                            raise SideError(
                                one.side,
                                "cpu",
                                f"{who} serving engine used more cores than it may: {why_cpu}",
                            )
                    run.samples += pair
                    b, h = sorted(pair, key=lambda x: x.side is Side.HEAD)
                    log(
                        f"block {block + 1} ctx {c.ctx} pair {i + 1}: main {b.decode_tps:.2f} tok/s, "
                        f"PR {h.decode_tps:.2f} tok/s ({h.decode_tps / b.decode_tps - 1:+.1%})"
                    )
                    if progress is not None:
                        est = _estimates(run.samples, c.ctx)
                        n = len(pairs_at(run.samples, c.ctx, "decode")[0])
                        progress(
                            {
                                "stage": "A/B",
                                "block": block + 1,
                                "blocks_max": max_blocks,
                                "context": c.ctx,
                                "pairs": n,
                                "pairs_max": max_blocks * per_block,
                                "ratio": est.ratio if est else h.decode_tps / b.decode_tps,
                                "ci": (est.ci_low, est.ci_high) if est else None,
                                "eta_s": max(m.time_budget_s - (time.monotonic() - start), 0.0),
                            }
                        )
        except BaseException:
            _close(procs)
            raise
        run.blocks += 1
        for c in profile.contexts:
            for metric in ("decode", "decode_cpu"):
                est = _estimates(run.samples, c.ctx, metric)
                if est is not None:
                    log(
                        f"ctx {c.ctx} {metric}: {est.ratio:.4f}x [{est.ci_low:.4f}, {est.ci_high:.4f}] over "
                        f"{run.blocks} blocks, MDE {est.mde:.2%}"
                    )
        elapsed = time.monotonic() - start
        why = None
        whole = run.blocks % 2 == 0  # decide only on whole crossovers
        if run.blocks >= max_blocks:
            why = f"the pair cap ({cap} per context)"
        elif whole and run.blocks >= min_blocks and _done(run, profile, m.ci_half_width):
            why = f"every scored context's CI is within ±{m.ci_half_width:.1%}"
        elif whole and run.blocks >= min_blocks and decided is not None and decided(run.samples):
            why = "no further pair could change the decision"
        elif whole and run.blocks >= min_blocks and elapsed * (run.blocks + 2) / run.blocks > m.time_budget_s:
            why = f"two more blocks would overrun the {m.time_budget_s} s budget"
        if why:
            log(f"A/B done after {run.blocks} blocks ({elapsed:.0f} s): {why}")
            return run, procs
        _close(procs)


def _done(run: Run, profile: Profile, half_width: float) -> bool:
    for c in profile.contexts:
        if not c.scored:
            continue
        est = _estimates(run.samples, c.ctx)
        if est is None or est.half_width > half_width:
            return False
    return True


# While a block starts, a side may use up to this many times its threads' worth of CPU, plus the grace:
# an engine told to use one thread loads on one core; one that floods the box while main loads (forked
# spinners, at once or while it waits ready for main) would slow main's load past its ready timeout
LOAD_CPU_SLACK = 1.5
LOAD_CPU_GRACE_S = 2.0


# While a timed request runs (its prefill, and its decode, each on its own), a side may use this many times
# its threads' worth of CPU, plus the grace (two ticks of the coarsest meter, and a little): an engine told
# to use one thread reads 1.000 CPU-seconds per wall second on the cpu profile (make demo, 2026-12-06); one
# that takes the core the frozen side leaves free during its prefill reads 2
REQUEST_CPU_SLACK = 1.25
REQUEST_CPU_GRACE_S = 0.025


def request_overuse(s: Sample, threads: int | None) -> str | None:
    """Why a timed request's CPU use is past the cores the profile gives each engine (None: within them,
    unmetered, or no per-engine thread count). Prefill and decode are each held to it: work moved into
    the prefill on a core the profile never granted is caught there. Pure."""
    if threads is None:
        return None
    prefill_s = s.context / s.prefill_tps if s.prefill_tps > 0 else 0.0
    for phase, cpu, wall in (("prefill", s.prefill_cpu_s, prefill_s), ("decode", s.decode_cpu_s, s.decode_s)):
        if cpu is None or wall <= 0:
            continue
        allowed = threads * REQUEST_CPU_SLACK * wall + REQUEST_CPU_GRACE_S
        if cpu > allowed:
            return (
                f"its {phase} at ctx {s.context} took {cpu:.3f} CPU-seconds in {wall:.3f} s "
                f"({cpu / wall:.2f} cores), where the profile gives each engine {threads} "
                f"thread{'s' if threads != 1 else ''} (allowed: {allowed:.3f} CPU-seconds)"
            )
    return None


def load_overuse(cpu_s: float | None, wall_s: float, threads: int | None) -> str | None:
    """Why a side's CPU use while its block started is past its allowance (None: within it, unmetered, or
    no per-engine thread count, where every core is the engine's anyway)."""
    if threads is None or cpu_s is None:
        return None
    allowed = threads * LOAD_CPU_SLACK * wall_s + LOAD_CPU_GRACE_S
    if cpu_s <= allowed:
        return None
    return (
        f"its process tree used {cpu_s:.1f} CPU-seconds in the {wall_s:.1f} s the block took to start "
        f"({cpu_s / max(wall_s, 1e-9):.2f} cores), where the profile gives each engine {threads} "
        f"thread{'s' if threads != 1 else ''} (allowed: {allowed:.1f} CPU-seconds)"
    )


def _start_block(
    launch: Launch,
    timeout_s: float,
    log: Log,
    base_first: bool = True,
    parallel: bool = False,
    threads: int | None = None,
) -> dict[Side, ServedProcess]:
    """A fresh serving process per side, main launched first when `base_first`, else the PR; both are frozen
    once both are ready. Serial (the default): the second launches once the first is ready, and the first
    waits idle (reading its stdin), not frozen, meanwhile: with every core per engine two loads at once
    fight over the cores and memory bandwidth (90 s instead of 30), and on a 2-core VM a load next to a
    stopped process took 11.5 s instead of 6.5 (next to an idle one, 7.3). `parallel`: both launch at once,
    each timed from the block's start: with one engine thread each on that VM both were ready in 4.7-5.6 s
    against 11-20 s for the two one after the other.

    With `threads` (the profile's per-engine count), a side whose process tree used more CPU than its
    allowance (`load_overuse`) from its launch until both were ready fails: checked once both are ready,
    and when main fails to start, the PR's use is checked first (a PR that starved main's load is blamed,
    not main)."""
    procs: dict[Side, ServedProcess] = {}
    launched: dict[Side, float] = {}
    order = (Side.BASE, Side.HEAD) if base_first else (Side.HEAD, Side.BASE)
    try:
        block_t0 = time.monotonic()
        try:
            for side in order:
                launched[side] = time.monotonic()
                procs[side] = launch(side)
                if not parallel:
                    _wait_ready(side, procs[side], timeout_s, log, launched[side])
            for side in order if parallel else ():
                _wait_ready(side, procs[side], timeout_s, log, block_t0)
        except SideError as exc:
            if exc.side is Side.BASE and Side.HEAD in procs:
                _check_load(Side.HEAD, procs, launched, threads, exc)
            raise
        for side in (Side.BASE, Side.HEAD):
            _check_load(side, procs, launched, threads)
        vocab = {side: p.vocab for side, p in procs.items()}
        if vocab.get(Side.HEAD) != vocab.get(Side.BASE):
            # each side's tokens are bounded by the vocabulary its own ready line names: the PR's must be
            # main's, or tokens past main's model would reach the audit as main's failure
            raise SideError(
                Side.HEAD,
                "protocol",
                f"the PR's engine names a vocabulary of {vocab.get(Side.HEAD)} tokens, main's of "
                f"{vocab.get(Side.BASE)}: the same model has one",
            )
        for p in procs.values():
            p.freeze()
        return procs
    except BaseException:
        _close(procs)
        raise


def _check_load(
    side: Side,
    procs: dict[Side, ServedProcess],
    launched: dict[Side, float],
    threads: int | None,
    cause: BaseException | None = None,
) -> None:
    why = load_overuse(procs[side].cpu_s(), time.monotonic() - launched[side], threads)
    if why is not None:
        who = "main's" if side is Side.BASE else "the PR's"
        raise SideError(side, "cpu", f"{who} serving engine used more CPU than it may: {why}") from cause


def _wait_ready(side: Side, p: ServedProcess, timeout_s: float, log: Log, t0: float) -> None:
    try:
        p.wait_ready(timeout_s)
    except ServeError as exc:
        raise SideError(side, exc.stage, f"the serving engine did not start: {exc}", exc.tail) from exc
    log(f"{p.label}'s serving engine ready in {time.monotonic() - t0:.1f} s")


def _close(procs: dict[Side, ServedProcess]) -> None:
    for p in procs.values():
        p.close()


def _pair(
    procs: dict[Side, ServedProcess],
    block: int,
    i: int,
    ctx: int,
    prompts: Prompts,
    gen: int,
    timeout_s: float,
    quiet: Quiet,
    gpu: bool,
    log: Log,
    run: Run,
    base_first: bool = True,
    stream: str = "token",
    slice_s: float | None = None,
    two: bool = False,
) -> list[Sample]:
    """One interleaved pair, measured again if others used the box meanwhile: on a fresh prompt each time (a
    prompt an engine has seen could be answered from a cache), until one attempt is clean or the quiet
    budget (`max_wait_s`, at least CONTAMINATED_RETRIES attempts) is spent, so that a bursty neighbour
    delays the pairs instead of ending the evaluation. Main goes first on even pairs of even blocks and odd
    pairs of odd blocks, so each side opens every block's first pair as often."""
    order = (Side.BASE, Side.HEAD) if (i + block) % 2 == 0 else (Side.HEAD, Side.BASE)
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        prompt = prompts.next(ctx)
        snap = box.cpu_snapshot()
        out = []
        prefills: list[Timed | None] = [None] * len(order)
        if two:
            prefills = list(
                _answers(procs, order, {"op": "prefill", "prompt_ids": prompt}, timeout_s, slice_s)
            )
            prompt = [*prompt, continuation(procs)]  # drawn now: no engine could know it before
            answers = _answers(procs, order, _continue(prompt[-1], gen, stream), timeout_s, slice_s)
        else:
            answers = _answers(procs, order, _generate(prompt, gen, stream), timeout_s, slice_s)
        for side, timed, pre in zip(order, answers, prefills, strict=True):
            out.append(
                sample(
                    side,
                    ctx,
                    block,
                    i,
                    prompt,
                    gen,
                    timed,
                    base_first=base_first,
                    went_first=side is order[0],
                    stream=stream,
                    prefill=pre,
                )
            )
        during = box.usage(snap, box.cpu_snapshot(), os.getpid())
        reason = box.busy_reason(during, quiet)
        if reason is None:
            run.box_samples.append(
                {
                    "block": block + 1,
                    "context": ctx,
                    "pair": i + 1,
                    "during_other_cores": round(during.other_cores, 3),
                    "during_others_top": [f"{n} {c:.2f}" for n, c in during.top],
                }
            )
            return out
        spent = time.monotonic() - start
        if attempt >= CONTAMINATED_RETRIES and spent >= quiet.max_wait_s:
            raise box.BoxBusy(f"box busy: {reason}, during {attempt} attempts at one pair over {spent:.0f} s")
        log(f"pair measured again: while it ran, {reason}")
        box.wait_until_quiet(quiet, with_gpu=gpu, log=log)


def _answers(
    procs: dict[Side, ServedProcess],
    order: tuple[Side, Side],
    body: dict[str, Any],
    timeout_s: float,
    slice_s: float | None,
) -> list[Timed]:
    """Both sides' answers to one request: one after the other, each alone, or (`slice_s`) in alternating
    slices of the harness's time (`served.run_sliced`); a failure is its side's."""
    if slice_s:
        others = [p for s, p in procs.items() if s not in order]
        try:
            return served.run_sliced([procs[s] for s in order], others, body, slice_s, timeout_s)
        except served.SliceError as exc:
            raise SideError(order[exc.which], exc.stage, str(exc), exc.tail) from exc
    out = []
    for side in order:
        other = [p for s, p in procs.items() if s is not side]
        try:
            out.append(run_alone(procs[side], other, partial(procs[side].request, body, timeout_s)))
        except ServeError as exc:
            raise SideError(side, exc.stage, str(exc), exc.tail) from exc
    return out


def warm(
    procs: dict[Side, ServedProcess],
    contexts: list[int],
    prompts: Prompts,
    gen: int,
    timeout_s: float,
    stream: str,
    n: int,
    two: bool = False,
) -> None:
    """`n` untimed requests per context and side, each side alone, each on a fresh prompt that no timed
    request will use: a fresh process compiles the shapes a timed request takes (the prefill's chunks at
    that context, the decode) here, off the clock, both sides alike. Measured on the H200 (2026-12-04):
    without it the first 4k request of every block carried that compile, main's from its shared compile
    cache and the PR's from nothing, and an A/A run read the PR's prefill 32% slower (a REJECT)."""
    for ctx in contexts:
        for _ in range(n):
            prompt = prompts.next(ctx)
            for side, proc in procs.items():
                others = [p for s, p in procs.items() if s is not side]
                try:
                    if two:
                        run_alone(
                            proc,
                            others,
                            partial(proc.request, {"op": "prefill", "prompt_ids": prompt}, timeout_s),
                        )
                        body = _continue(continuation(procs), gen, stream)
                    else:
                        body = _generate(prompt, gen, stream)
                    run_alone(proc, others, partial(proc.request, body, timeout_s))
                except ServeError as exc:
                    raise SideError(side, exc.stage, f"a warm-up request failed: {exc}", exc.tail) from exc


def _generate(prompt: list[int], gen: int, stream: str) -> dict[str, Any]:
    """A timed generate request (greedy); `stream` "ends" asks for the first token and then the rest."""
    body: dict[str, Any] = {"op": "generate", "prompt_ids": prompt, "max_new": gen}
    if stream != "token":
        body["stream"] = stream
    return body


def _continue(token: int, gen: int, stream: str) -> dict[str, Any]:
    """The timed part of a two-part request: the prefilled prompt continued by `token`, then decoded."""
    return {**_generate([token], gen, stream), "continue": True}


def continuation(procs: dict[Side, ServedProcess]) -> int:
    """The continuation token: drawn by the harness once the prefills have answered, from a source no
    engine can predict (not the seeded prompts), within every side's vocabulary."""
    return secrets.randbelow(min(p.vocab for p in procs.values()))


def two_part(procs: dict[Side, ServedProcess]) -> bool:
    """Whether requests go in two parts: where main's engine lists the `prefill` op in its ready line. The
    PR's must then list it too (SideError, stage 'protocol'): a PR cannot choose the one-part clock."""
    if Side.BASE not in procs or "prefill" not in _ops(procs[Side.BASE]):
        return False
    for side, p in procs.items():
        if "prefill" not in _ops(p):
            raise SideError(
                side,
                "protocol",
                "main's engine answers the 'prefill' op, and this one does not list it in its ready line: "
                "each request is timed as a prefill and a continuation, so that no decode step can run "
                "before the decode clock starts",
            )
    return True


def _ops(p: ServedProcess) -> list[str]:
    ops = p.ready.get("ops")
    return [o for o in ops if isinstance(o, str)] if isinstance(ops, list) else []


MAX_DECODE_TPS = 1e5  # faster than any engine: tokens that arrive this fast came in a burst


def sample(
    side: Side,
    ctx: int,
    block: int,
    i: int,
    prompt: list[int],
    gen: int,
    t: Timed,
    *,
    base_first: bool = True,
    went_first: bool = True,
    stream: str = "token",
    prefill: Timed | None = None,
) -> Sample:
    """One timed request as a Sample, its shape checked. With `prefill` (two parts), the prefill is that
    request's whole time and the decode runs from sending the continuation `t` to its last token."""
    if prefill is not None and prefill.tokens:
        raise SideError(
            side, "protocol", f"a prefill request answered {len(prefill.tokens)} tokens (none are asked)"
        )
    if len(t.tokens) != gen:
        raise SideError(side, "serve", f"asked for {gen} tokens, the engine streamed {len(t.tokens)}")
    shape = (1,) * gen if stream == "token" else (1, gen - 1)[: min(gen, 2)]
    if tuple(len(step) for step in t.steps) != shape:
        how = "one line per token" if stream == "token" else "the first token, then the rest in one line"
        raise SideError(
            side,
            "serve",
            f"{gen} tokens arrived in {len(t.arrivals_ns)} lines "
            f"({', '.join(str(len(x)) for x in t.steps[:8])}{', ...' if len(t.steps) > 8 else ''} tokens); "
            f"a generate request streams {how}",
        )
    if prefill is None:
        prefill_s, prefill_cpu_s = t.prefill_s, t.prefill_cpu_s
        decode_s, cpu, steps = t.decode_s, t.decode_cpu_s, gen - 1
    else:
        prefill_s, prefill_cpu_s = prefill.answer_s, prefill.answer_cpu_s
        decode_s, cpu, steps = t.to_last_s, t.to_last_cpu_s, gen
    if prefill_s <= 0:
        raise SideError(side, "protocol", "the prefill's answer arrived before the request was sent")
    decode_tps = steps / decode_s if decode_s > 0 else float("inf")
    if decode_tps > MAX_DECODE_TPS:
        raise SideError(
            side,
            "serve",
            f"{gen} tokens arrived within {decode_s * 1e6:.0f} µs: a burst, not a "
            "decode (they were computed before the first was sent)",
        )
    timings = t.summary.get("timings")
    reported = timings if isinstance(timings, dict) else {}
    if prefill is not None:
        pre = prefill.summary.get("timings")
        if isinstance(pre, dict) and isinstance(pre.get("prefill_s"), (int, float)):
            reported = {**reported, "prefill_s": pre["prefill_s"]}
    if cpu is not None and cpu <= 0:
        cpu = None  # a coarse meter (10 ms ticks) that did not move: no CPU reading for this request
    return Sample(
        side,
        ctx,
        block,
        i,
        tuple(prompt),
        t.tokens,
        ctx / prefill_s,
        decode_tps,
        {k: v for k, v in reported.items() if isinstance(v, (int, float))},
        t.summary.get("n"),
        decode_s=decode_s,
        decode_cpu_s=cpu,
        prefill_cpu_s=prefill_cpu_s,
        steal_ticks=t.steal_ticks,
        switches=t.switches,
        base_first=base_first,
        went_first=went_first,
        decode_steps=steps,
    )


def random_prompts(vocab: int, seed: int) -> Callable[[int, int], list[int]]:
    """Seeded random token ids (random-weight shapes have no tokenizer); each serial its own draw."""
    import random

    def source(ctx: int, serial: int) -> list[int]:
        rng = random.Random(f"{seed}:{serial}")
        return [rng.randrange(vocab) for _ in range(ctx)]

    return source
