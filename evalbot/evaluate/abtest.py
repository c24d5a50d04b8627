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

This module runs the blocks and the pairs (`measure`); the data and the pairs read from it are in
`ab_samples`, the pair design in `ab_design`, a block's processes (start, load check, warm-up) in
`ab_block`, one timed request as a Sample in `ab_sampling`, the request bodies and the two-part request
in `ab_twopart`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from evalbot.evaluate import box, pinning, schedule
from evalbot.evaluate.ab_block import Launch, Log, close, request_length, start_block, warm
from evalbot.evaluate.ab_design import allocate, design
from evalbot.evaluate.ab_samples import (
    BurstError,
    Prompts,
    Run,
    Sample,
    SideError,
    estimates,
    forgive_burst,
    pairs_at,
)
from evalbot.evaluate.ab_sampling import request_overuse, sample
from evalbot.evaluate.ab_twopart import continuation, continue_body, generate_body, two_part
from evalbot.evaluate.schedule import run_alone
from evalbot.evaluate.serve_error import ServeError
from evalbot.evaluate.served import ServedProcess
from evalbot.evaluate.timed import Timed
from evalbot.model import Side
from evalbot.rules import Profile, Quiet

CONTAMINATED_RETRIES = 3


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
    between: Callable[[int, dict[Side, ServedProcess], Run], None] | None = None,
) -> tuple[Run, dict[Side, ServedProcess]]:
    """Run pairs of blocks (the crossover: each load order once) until every scored context's CI is narrow
    enough or `decided` says no further pair could change the verdict, or the pair cap, or the time budget.
    `settled` is called in every block once both processes are ready and warmed, frozen, before the first
    timed request; `between` (the spec runs) at the end of every block, with its processes, its time kept
    out of the A/B's budget. The last block's processes are returned still running (frozen), for the audit and the
    spec runs: the caller closes them."""
    m = profile.measurement
    quiet = quiet or profile.quiet
    cap = max_pairs or m.max_pairs
    per_block, max_blocks, min_blocks = design(m.pairs_per_block, m.min_blocks, cap)
    gpu = profile.device == "cuda"
    contexts = [c.ctx for c in profile.contexts]
    run = Run(min_blocks=min_blocks)
    pin = pinning.engine_cpus(pinning.usable_cpus(), m.threads) if m.pin and m.threads else frozenset()
    if pin:
        log(
            f"both engines pinned to CPU {pinning.format_cpu_list(pin)} once ready, the others left to the harness"
        )
    start = time.monotonic()
    aside = 0.0  # seconds spent in `between`
    while True:
        block = run.blocks
        before, waited = box.wait_until_quiet(quiet, with_gpu=gpu, log=log)
        run.box_samples.append(
            {"block": block + 1, "waited_s": round(waited, 1), **before.as_record(), **box.state()}
        )
        base_first = block % 2 == 0
        procs = start_block(launch, ready_timeout_s, log, base_first, m.start == "parallel", m.threads, pin)
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
            if not run.gen:
                run.gen = _lengths(procs, profile, prompts, request_timeout_s, two, log)
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
                        run.gen[c.ctx],
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
                        est = estimates(run.samples, c.ctx)
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
            if between is not None:
                t0 = time.monotonic()
                between(block, procs, run)
                aside += time.monotonic() - t0
        except BaseException:
            close(procs)
            raise
        run.blocks += 1
        for c in profile.contexts:
            for metric in ("decode", "decode_cpu"):
                est = estimates(run.samples, c.ctx, metric)
                if est is not None:
                    log(
                        f"ctx {c.ctx} {metric}: {est.ratio:.4f}x [{est.ci_low:.4f}, {est.ci_high:.4f}] over "
                        f"{run.blocks} blocks, MDE {est.mde:.2%}"
                    )
        elapsed = time.monotonic() - start - aside
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
        close(procs)


def _lengths(
    procs: dict[Side, ServedProcess],
    profile: Profile,
    prompts: Prompts,
    timeout_s: float,
    two: bool,
    log: Log,
) -> dict[int, int]:
    """Tokens a timed request asks for at each context: `decode_tokens`, or with `decode_s`, that many
    seconds of main's decode there (`request_length`)."""
    m = profile.measurement
    gen = {c.ctx: m.decode_tokens for c in profile.contexts}
    if m.decode_s is None:
        return gen
    for ctx in gen:
        gen[ctx] = request_length(
            procs, ctx, prompts, m.decode_tokens, timeout_s, m.stream, two, m.decode_s, m.max_decode_tokens
        )
        log(f"ctx {ctx}: {gen[ctx]} tokens a timed request, about {m.decode_s:g} s of main's decode")
    return gen


def _done(run: Run, profile: Profile, half_width: float) -> bool:
    """Every scored context's CI within the half-width; for a guard (a model scored nowhere), every guarded one's."""
    judged = [c for c in profile.contexts if c.scored] or [c for c in profile.contexts if c.guarded]
    for c in judged:
        est = estimates(run.samples, c.ctx)
        if est is None or est.half_width > half_width:
            return False
    return True


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
                answer_pair(procs, order, {"op": "prefill", "prompt_ids": prompt}, timeout_s, slice_s)
            )
            prompt = [*prompt, continuation(procs)]  # drawn now: no engine could know it before
            answers = answer_pair(procs, order, continue_body(prompt[-1], gen, stream), timeout_s, slice_s)
        else:
            answers = answer_pair(procs, order, generate_body(prompt, gen, stream), timeout_s, slice_s)
        try:
            for side, timed, pre in zip(order, answers, prefills, strict=True):
                out.append(sample(side, ctx, block, i, prompt, gen, timed, base_first=base_first,
                                  went_first=side is order[0], stream=stream, prefill=pre))  # fmt: skip
        except BurstError as exc:
            # the kernel stamps each write, so a late reader no longer makes one (`stamped`); a burst is
            # the engine's, measured again up to BURSTS_FORGIVEN times a side (it wins nothing either way:
            # its pair is never kept)
            forgive_burst(run, exc, log, "pair")
            continue
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


def answer_pair(
    procs: dict[Side, ServedProcess],
    order: tuple[Side, Side],
    body: dict[str, Any],
    timeout_s: float,
    slice_s: float | None,
) -> list[Timed]:
    """Both sides' answers to one request: one after the other, each alone, or (`slice_s`) in alternating
    slices of the harness's time (`schedule.run_sliced`); a failure is its side's."""
    if slice_s:
        others = [p for s, p in procs.items() if s not in order]
        try:
            return schedule.run_sliced([procs[s] for s in order], others, body, slice_s, timeout_s)
        except schedule.SliceError as exc:
            raise SideError(order[exc.which], exc.stage, str(exc), exc.tail) from exc
    out = []
    for side in order:
        other = [p for s, p in procs.items() if s is not side]
        try:
            out.append(run_alone(procs[side], other, partial(procs[side].request, body, timeout_s)))
        except ServeError as exc:
            raise SideError(side, exc.stage, str(exc), exc.tail) from exc
    return out


def random_prompts(vocab: int, seed: int) -> Callable[[int, int], list[int]]:
    """Seeded random token ids (random-weight shapes have no tokenizer); each serial its own draw."""
    import random

    def source(ctx: int, serial: int) -> list[int]:
        rng = random.Random(f"{seed}:{serial}")
        return [rng.randrange(vocab) for _ in range(ctx)]

    return source
