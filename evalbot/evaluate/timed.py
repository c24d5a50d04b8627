"""One request as the harness clocked it: each protocol line's arrival (`Line`) and the request's wall and
CPU clocks (`Timed`), less the time the harness held the process frozen. Nothing the engine says about time
is read here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Line:
    """One protocol line as the harness received it, with the harness's own arrival time and the CPU time
    the engine's process tree had used by then (-1 where the meter could not be read)."""

    at_ns: int
    obj: dict[str, Any]
    cpu_ns: int = -1


@dataclass(frozen=True)
class Timed:
    """One request as the harness saw it: when it was sent, each token's arrival, and the summary."""

    request: dict[str, Any]
    sent_ns: int
    tokens: tuple[int, ...]
    arrivals_ns: tuple[int, ...]  # per streamed line: when it arrived
    steps: tuple[tuple[int, ...], ...]  # tokens per streamed line (one each for generate)
    summary: dict[str, Any]
    cpu_sent_ns: int = -1  # the tree's CPU time when the request was sent
    cpu_arrivals_ns: tuple[int, ...] = ()  # per streamed line: the tree's CPU time when it arrived
    switches: tuple[int, int] = (
        0,
        0,
    )  # voluntary, involuntary context switches of the tree during the request
    steal_ticks: int = 0  # the machine's steal (all CPUs, /proc/stat) during the request
    # where the harness froze the process while the request was open (sliced pairs): (from, to) ns
    paused_ns: tuple[tuple[int, int], ...] = ()
    done_ns: int = 0  # when the summary line arrived
    cpu_done_ns: int = -1  # the tree's CPU time then
    # the tree's CPU time at the freeze that followed the request (run_alone, run_sliced): what it used after
    # its summary line and before it stopped is then on the request's CPU clock, not on none
    cpu_frozen_ns: int = -1
    # on a GPU profile, when the device had run what the engine left queued after the request, where that
    # was after its freeze (0: idle at once, or not probed): work it queued without waiting for ran on
    # while the other side was timed, so the request's wall clock ends there, if later than its answer
    device_idle_ns: int = 0

    def _paused(self, start: int, end: int) -> int:
        """Nanoseconds of [start, end] that the process spent frozen by the harness."""
        return sum(max(0, min(b, end) - max(a, start)) for a, b in self.paused_ns)

    @property
    def decode_cpu_s(self) -> float | None:
        """CPU seconds the tree used from the first token to the last; None where not metered."""
        c = self.cpu_arrivals_ns
        if len(c) < 2 or min(c) < 0:
            return None
        return (c[-1] - c[0]) / 1e9

    @property
    def prefill_cpu_s(self) -> float | None:
        """CPU seconds from sending the request to the first token; None where not metered."""
        if not self.cpu_arrivals_ns or self.cpu_sent_ns < 0 or self.cpu_arrivals_ns[0] < 0:
            return None
        return (self.cpu_arrivals_ns[0] - self.cpu_sent_ns) / 1e9

    @property
    def prefill_s(self) -> float:
        """From sending the request to the first token (a burst of every token at the end lands here),
        less the time the harness kept the process frozen."""
        return (self.arrivals_ns[0] - self.sent_ns - self._paused(self.sent_ns, self.arrivals_ns[0])) / 1e9

    @property
    def decode_s(self) -> float:
        """From the first token to the last (or to the device's idle, `device_idle_ns`, if later), less the
        time the harness kept the process frozen."""
        first, last = self.arrivals_ns[0], max(self.arrivals_ns[-1], self.device_idle_ns)
        return (last - first - self._paused(first, last)) / 1e9

    @property
    def answer_s(self) -> float:
        """From sending the request to its summary line (or to the device's idle, `device_idle_ns`, if
        later), less the time the harness kept it frozen (a prefill request's whole time)."""
        end = max(self.done_ns, self.device_idle_ns)
        return (end - self.sent_ns - self._paused(self.sent_ns, end)) / 1e9

    @property
    def answer_cpu_s(self) -> float | None:
        """CPU seconds from sending the request to the freeze that followed it (to its summary line where it
        was not frozen after); None where not metered. A prefill's work finished after its answer, before
        the harness stopped the engine, is on this clock."""
        end = self.cpu_frozen_ns if self.cpu_frozen_ns >= 0 else self.cpu_done_ns
        if self.cpu_sent_ns < 0 or end < 0:
            return None
        return (end - self.cpu_sent_ns) / 1e9

    @property
    def to_last_s(self) -> float:
        """From sending the request to its last token, less the time the harness kept it frozen: the
        decode of a continuation, whose every step comes after the harness sent what it depends on. It
        ends at the device's idle (`device_idle_ns`) where that is later."""
        last = max(self.arrivals_ns[-1], self.device_idle_ns)
        return (last - self.sent_ns - self._paused(self.sent_ns, last)) / 1e9

    @property
    def to_last_cpu_s(self) -> float | None:
        """CPU seconds from sending the request to its last token; None where not metered."""
        c = self.cpu_arrivals_ns
        if not c or self.cpu_sent_ns < 0 or c[-1] < 0:
            return None
        return (c[-1] - self.cpu_sent_ns) / 1e9

    @property
    def decode_tps(self) -> float:
        """(N - 1) tokens over the first-to-last interval, as the harness clocked it."""
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else float("inf")
