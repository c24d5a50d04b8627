"""Which of several kernels for one operation runs at a shape: one that passed a parity test there.

Each candidate is tried on fresh random inputs of the exact shape: its output must match the
reference (no NaN, every element written, relative error under the tolerance). A candidate that is
fast but wrong is never chosen, and one that raises is recorded with its error. Two ways to choose,
each a pure function of the trials: `first_passed`, the preference order (a table: nothing is timed,
so every process of the same code picks the same kernel), and `pick`, the fastest by device time
(an experiment: on the H200 near-ties made fresh processes pick differently, docs/benchmarks.md #40).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# near-ties go to the earlier candidate (the preference order), so a choice does not flip on noise
TIE = 0.01


@dataclass(frozen=True)
class Trial:
    """One candidate at one shape: its parity error and device time, or why it was not timed."""

    name: str
    rel_err: float | None = None
    us: float | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None


def _nothing_passed(trials: Sequence[Trial]) -> ValueError:
    return ValueError(
        "no kernel passed its parity test: " + "; ".join(f"{t.name}: {t.error}" for t in trials)
    )


def first_passed(trials: Sequence[Trial]) -> str:
    """The earliest trial in order that passed its parity test. ValueError if none passed."""
    for t in trials:
        if t.passed:
            return t.name
    raise _nothing_passed(trials)


def pick(trials: Sequence[Trial], tie: float = TIE) -> str:
    """The fastest trial that passed; within `tie` of it, the earliest in order. ValueError if none passed."""
    passed = [t for t in trials if t.passed and t.us is not None]
    if not passed:
        raise _nothing_passed(trials)
    best = min(t.us for t in passed if t.us is not None)
    return next(t.name for t in passed if t.us is not None and t.us <= best * (1 + tie))


def parity_error(got: torch.Tensor, want: torch.Tensor) -> tuple[float, str | None]:
    """Relative error of `got` against `want` in the Frobenius norm, and a failure reason if it is bad."""
    if got.shape != want.shape:
        return float("inf"), f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    got64, want64 = got.double(), want.double()
    if not torch.isfinite(got64).all():
        return float("inf"), "non-finite output (an element left unwritten, or NaN read past a length)"
    rel = ((got64 - want64).norm() / want64.norm().clamp_min(1e-30)).item()
    return rel, None


def device_time_us(calls: Sequence[Callable[[], object]], replays: int = 10, rounds: int = 5) -> float:
    """Median device time of one call, replaying the calls (cycled over input copies) in a CUDA graph."""
    calls = list(calls) * max(1, -(-16 // len(calls)))  # at least 16 calls a replay, as in a decode step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and allocate outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * len(calls)))
    return statistics.median(times)


def run_trials(
    candidates: Sequence[tuple[str, Callable[..., torch.Tensor], Callable[..., list[str]]]],
    inputs: Sequence[tuple[torch.Tensor, ...]],
    want: Sequence[torch.Tensor],
    tolerance: float,
    timed: Sequence[tuple[torch.Tensor, ...]] | None = None,
    time_fn: Callable[[Sequence[Callable[[], object]]], float] | None = device_time_us,
) -> list[Trial]:
    """Try each (name, run(*args, out=...), unsupported_reasons(*args)) on every input set, then time it.

    `inputs` are the parity cases (poisoned where a kernel must not read) and `want` their reference
    outputs; `timed` are the input sets the timing cycles over (default: `inputs`). With `time_fn` None
    nothing is timed and the trials stop at the first candidate that passes (the preference order).
    """
    trials = []
    for name, run, reasons_of in candidates:
        reasons = reasons_of(*inputs[0])
        if reasons:
            trials.append(Trial(name, error="unsupported: " + "; ".join(reasons)))
            continue
        try:
            worst = 0.0
            failure = None
            for args, ref in zip(inputs, want, strict=True):
                # poisoned: every element must be written; outputs take the first input's dtype
                out = torch.full(ref.shape, float("nan"), dtype=args[0].dtype, device=ref.device)
                run(*args, out=out)
                rel, failure = parity_error(out, ref)
                worst = max(worst, rel)
                if failure is None and rel > tolerance:
                    failure = f"relative error {rel:.2e} > {tolerance:.0e}"
                if failure:
                    break
            if failure:
                trials.append(Trial(name, rel_err=worst, error=f"parity: {failure}"))
                continue
            if time_fn is None:
                trials.append(Trial(name, rel_err=worst))
                break
            sets = timed or inputs
            outs = [torch.empty(want[0].shape, dtype=a[0].dtype, device=want[0].device) for a in sets]
            calls = [lambda a=a, o=o, f=run: f(*a, out=o) for a, o in zip(sets, outs, strict=True)]
            trials.append(Trial(name, rel_err=worst, us=time_fn(calls)))
        except Exception as exc:  # a candidate that crashes is recorded, never fatal
            trials.append(Trial(name, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
    return trials
