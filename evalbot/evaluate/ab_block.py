"""A block's serving processes: started (one after the other, or at once), each side's CPU while they load
held to its allowance (`load_overuse`), the same vocabulary on both, frozen once ready; then warmed with
untimed requests (`warm`), each side alone; and closed."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from evalbot.evaluate.ab_samples import Prompts, SideError
from evalbot.evaluate.ab_twopart import continuation, continue_body, generate_body
from evalbot.evaluate.device_idle import DRAIN_LIMIT_S
from evalbot.evaluate.schedule import run_alone
from evalbot.evaluate.serve_error import ServeError
from evalbot.evaluate.served import ServedProcess
from evalbot.evaluate.timed import Timed
from evalbot.model import Side

Launch = Callable[[Side], ServedProcess]
Log = Callable[[str], None]


# While a block starts, a side may use up to this many times its threads' worth of CPU, plus the grace:
# an engine told to use one thread loads on one core; one that floods the box while main loads (forked
# spinners, at once or while it waits ready for main) would slow main's load past its ready timeout
LOAD_CPU_SLACK = 1.5
LOAD_CPU_GRACE_S = 2.0


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


def start_block(
    launch: Launch,
    timeout_s: float,
    log: Log,
    base_first: bool = True,
    parallel: bool = False,
    threads: int | None = None,
    pin: frozenset[int] = frozenset(),
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
    not main). With `pin`, both are held to those CPUs once both are ready (module pinning)."""
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
        for side, p in procs.items() if pin else ():
            try:
                p.pin(pin)
            except ServeError as exc:
                raise SideError(side, exc.stage, str(exc), exc.tail) from exc
        for p in procs.values():
            p.freeze(drain=False)
        _drain_device(procs)
        return procs
    except BaseException:
        close(procs)
        raise


def _drain_device(procs: dict[Side, ServedProcess]) -> None:
    """On a GPU, once every engine of a block is frozen: wait for the device to run what they left queued
    at their ready lines. Where it stays busy past the limit, whose work it is cannot be told from the
    device: the PR's process is ended (its context and its queued work go with it) and the device asked
    again. Idle then, the work was the PR's; still busy, it was main's."""
    probe = next((p.device for p in procs.values() if p.device is not None), None)
    if probe is None or probe.drain(DRAIN_LIMIT_S).idle:
        return
    why = (
        f"said it was ready with work queued on the GPU that kept it busy for more than {DRAIN_LIMIT_S:g} s "
        "after the harness froze it"
    )
    if Side.HEAD in procs:
        procs[Side.HEAD].close()
        if probe.drain(DRAIN_LIMIT_S).idle:
            raise SideError(Side.HEAD, "frozen", f"the PR's serving engine {why}", procs[Side.HEAD].tail())
    raise SideError(Side.BASE, "frozen", f"main's serving engine {why}", procs[Side.BASE].tail())


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


def close(procs: dict[Side, ServedProcess]) -> None:
    for p in procs.values():
        p.close()


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
            for side in procs:
                try:
                    _untimed(procs, side, prompt, gen, timeout_s, stream, two)
                except ServeError as exc:
                    raise SideError(side, exc.stage, f"a warm-up request failed: {exc}", exc.tail) from exc


def _untimed(
    procs: dict[Side, ServedProcess],
    side: Side,
    prompt: list[int],
    gen: int,
    timeout_s: float,
    stream: str,
    two: bool,
) -> Timed:
    """One request of `gen` tokens to one side alone, as a timed one is asked (a prefill and a continuation
    where `two`); its answer."""
    proc = procs[side]
    others = [p for s, p in procs.items() if s is not side]
    if two:
        run_alone(proc, others, partial(proc.request, {"op": "prefill", "prompt_ids": prompt}, timeout_s))
        body = continue_body(continuation(procs), gen, stream)
    else:
        body = generate_body(prompt, gen, stream)
    return run_alone(proc, others, partial(proc.request, body, timeout_s))


def request_length(
    procs: dict[Side, ServedProcess],
    ctx: int,
    prompts: Prompts,
    gen: int,
    timeout_s: float,
    stream: str,
    two: bool,
    decode_s: float,
    max_gen: int,
) -> int:
    """The tokens a timed request asks for at `ctx` to decode for about `decode_s` seconds of main: main alone
    answers one untimed request of `gen` tokens on a fresh prompt, and its decode rate on the harness's clock
    sets the count, at least `gen` and at most `max_gen`. Only main's answer counts, so the PR cannot move
    it, and both sides are then asked the same count. The PR answers the same untimed request (its answer
    unread), so that neither side meets its first timed request warmer than the other."""
    prompt = prompts.next(ctx)
    rate = 0.0
    for side in (Side.BASE, Side.HEAD):
        try:
            got = _untimed(procs, side, prompt, gen, timeout_s, stream, two)
        except ServeError as exc:
            what = "the request that times main's decode" if side is Side.BASE else "an untimed request"
            raise SideError(side, exc.stage, f"{what} failed: {exc}", exc.tail) from exc
        if side is Side.BASE:
            # as the pairs are timed (ab_sampling.sample): a continuation from its sending to its last token,
            # a one-part request from its first token to its last
            steps, took = (len(got.tokens), got.to_last_s) if two else (len(got.tokens) - 1, got.decode_s)
            rate = steps / took if steps > 0 and took > 0 else 0.0
    if not rate > 0:
        return gen
    return max(gen, min(max_gen, round(decode_s * rate)))
