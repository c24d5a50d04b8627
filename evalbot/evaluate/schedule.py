"""Which serving process runs while a request is timed: `run_alone` (every other one frozen) and
`run_sliced` (the same request to each, in turns of the harness's time, the others frozen). A request's CPU
clock ends at the freeze that follows it."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evalbot.evaluate.serve_error import ServeError
from evalbot.evaluate.timed import Timed

if TYPE_CHECKING:
    from evalbot.evaluate.pending import Pending
    from evalbot.evaluate.served import ServedProcess


class SliceError(ServeError):
    """A sliced pair's request failed; `which` is the index of the process whose request it was."""

    def __init__(self, which: int, error: ServeError):
        super().__init__(str(error), error.tail, error.stage)
        self.which = which


def run_sliced(
    procs: list[ServedProcess],
    others: list[ServedProcess],
    body: dict[str, Any],
    slice_s: float,
    timeout_s: float,
) -> list[Timed]:
    """The same request to each of `procs`, answered in turns of `slice_s` seconds of the harness's time:
    one process runs while every other is frozen, then the next, until every answer is in (the last one
    left runs to its end). A request is sent at its process's first turn, and the time its process spent
    frozen after that is not its time (Timed.paused_ns). The box's drift over a few seconds then falls on
    both sides of a pair alike instead of on whichever ran second. SliceError names the failed request."""
    for other in others:
        if not other.frozen:
            other.freeze()
    for i, p in enumerate(procs):
        try:
            if not p.frozen:
                p.freeze()
        except ServeError as exc:
            raise SliceError(i, exc) from exc
    pending: list[Pending | None] = [None] * len(procs)
    done: list[Timed | None] = [None] * len(procs)
    turn = 0
    while any(d is None for d in done):
        i = turn % len(procs)
        turn += 1
        if done[i] is not None:
            continue
        p = procs[i]
        try:
            at = p.thaw()
            if pending[i] is None:
                pending[i] = p.begin(body, timeout_s)
            pend = pending[i]
            assert pend is not None
            pend.resume(at)
            last = sum(d is None for d in done) == 1
            result = pend.collect(None if last else time.monotonic() + slice_s)
        except ServeError as exc:
            with contextlib.suppress(ServeError):  # the request's own failure is the one to report
                p.freeze()
            raise SliceError(i, exc) from exc
        try:
            at = p.freeze()  # with a GPU probe, a device the process keeps busy is its request's failure
        except ServeError as exc:
            raise SliceError(i, exc) from exc
        if result is None:
            pend.pause(at)
        else:
            done[i] = dataclasses.replace(
                result, cpu_frozen_ns=p.frozen_cpu_ns, device_idle_ns=p.device_idle_ns
            )
    return [d for d in done if d is not None]


def run_alone(timed: ServedProcess, others: list[ServedProcess], call: Callable[[], Timed]) -> Timed:
    """Run one timed request with every other serving process frozen, and freeze it again after (the
    request's CPU clock then ends at that freeze, Timed.cpu_frozen_ns, and on a GPU its wall clock once the
    device has run what the engine left queued, Timed.device_idle_ns)."""
    for other in others:
        if not other.frozen:
            other.freeze()
    if timed.frozen:
        timed.thaw()
    try:
        result = call()
    except BaseException:
        timed.freeze()
        raise
    timed.freeze()
    return dataclasses.replace(result, cpu_frozen_ns=timed.frozen_cpu_ns, device_idle_ns=timed.device_idle_ns)
