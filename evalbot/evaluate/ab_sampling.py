"""One timed request as a `Sample`: its shape checked (the tokens asked for, streamed as asked, no burst),
its clocks read (one part, or a prefill and its continuation), and its CPU use held to the cores the profile
gives each engine (`request_overuse`). Pure."""

from __future__ import annotations

from evalbot.evaluate.ab_samples import BurstError, Sample, SideError
from evalbot.evaluate.timed import Timed
from evalbot.model import Side

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
        why = _overuse(f"its {phase} at ctx {s.context}", cpu, wall, threads)
        if why:
            return why
    return None


def answer_overuse(t: Timed, threads: int | None, what: str) -> str | None:
    """As `request_overuse`, for a whole answer from its sending to the freeze that followed it (a
    speculative run: its drafting, verifying and whatever it did after its last token)."""
    return None if threads is None else _overuse(what, t.answer_cpu_s, t.answer_s, threads)


def _overuse(what: str, cpu: float | None, wall: float, threads: int) -> str | None:
    if cpu is None or wall <= 0:
        return None
    allowed = threads * REQUEST_CPU_SLACK * wall + REQUEST_CPU_GRACE_S
    if cpu <= allowed:
        return None
    return (
        f"{what} took {cpu:.3f} CPU-seconds in {wall:.3f} s ({cpu / wall:.2f} cores), where the profile gives "
        f"each engine {threads} thread{'s' if threads != 1 else ''} (allowed: {allowed:.3f} CPU-seconds)"
    )


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
        raise BurstError(
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
