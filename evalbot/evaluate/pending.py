"""One request being answered: its lines collected as they arrive, each checked (the request it names, when
it arrived, its tokens within the vocabulary and the count asked for), into the harness's `Timed`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evalbot.evaluate import cpumeter
from evalbot.evaluate.serve_error import ServeError
from evalbot.evaluate.timed import Timed

if TYPE_CHECKING:
    from evalbot.evaluate.served import ServedProcess


@dataclass
class Pending:
    """A request that was sent and is being answered. `collect` takes its lines as they arrive, all of them
    or, in a sliced pair, those of one slice of the harness's time; `pause` and `resume` record when the
    harness froze and thawed the process in between, so that frozen time is not the engine's."""

    proc: ServedProcess
    body: dict[str, Any]
    req: dict[str, Any]
    rid: str
    sent_ns: int
    before: cpumeter.Reading
    steal0: int
    deadline: float  # time.monotonic() seconds
    timeout_s: float
    tokens: list[int] = field(default_factory=list)
    arrivals: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    steps: list[tuple[int, ...]] = field(default_factory=list)
    paused: list[tuple[int, int]] = field(default_factory=list)
    _paused_at: int | None = None

    def pause(self, at_ns: int) -> None:
        self._paused_at = at_ns

    def resume(self, at_ns: int) -> None:
        if self._paused_at is not None:
            self.paused.append((self._paused_at, max(at_ns, self._paused_at)))
            self._paused_at = None

    def collect(self, until: float | None = None) -> Timed | None:
        """The request's Timed once its summary arrives; None if `until` (monotonic s) comes first."""
        try:
            return self._collect(until)
        except ServeError:
            self.proc.broken = True
            raise

    def _collect(self, until: float | None) -> Timed | None:
        p = self.proc
        while True:
            line = p.next_line(self.deadline, self.timeout_s, until)
            if line is None:
                return None
            obj = line.obj
            if line.at_ns < self.sent_ns:  # request ids are predictable: an answer written ahead is no answer
                raise ServeError(
                    f"{p.label}: a line for {str(obj.get('id'))[:40]!r} arrived before the request was sent",
                    p.tail(),
                    stage="protocol",
                )
            if obj.get("id") != self.rid:
                raise ServeError(
                    f"{p.label}: a line for request {str(obj.get('id'))[:40]!r} while {self.rid} was "
                    "being served",
                    p.tail(),
                )
            if obj.get("event") == "error":
                raise ServeError(
                    f"{p.label}: refused request {self.rid}: {str(obj.get('message'))[:500]}", p.tail()
                )
            if obj.get("event") == "done":
                after = p.reading()
                switches = (
                    after.voluntary_switches - self.before.voluntary_switches,
                    after.involuntary_switches - self.before.involuntary_switches,
                )
                return Timed(
                    self.req,
                    self.sent_ns,
                    tuple(self.tokens),
                    tuple(self.arrivals),
                    tuple(self.steps),
                    obj,
                    cpu_sent_ns=self.before.cpu_ns,
                    cpu_arrivals_ns=tuple(self.cpus),
                    switches=switches,
                    steal_ticks=cpumeter.steal_ticks() - self.steal0,
                    paused_ns=tuple(self.paused),
                    done_ns=line.at_ns,
                    cpu_done_ns=line.cpu_ns,
                )
            got = [obj["tok"]] if "tok" in obj else obj.get("toks")
            if (
                not isinstance(got, list)
                or not got
                or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < p.vocab for t in got)
            ):
                raise ServeError(
                    f"{p.label}: request {self.rid}: not a token line: {str(obj)[:200]}", p.tail()
                )
            self.tokens += got
            self.arrivals.append(line.at_ns)
            self.cpus.append(line.cpu_ns)
            self.steps.append(tuple(got))
            if len(self.tokens) > self.body.get("max_new", 0) + 1 and self.body["op"] != "score":
                raise ServeError(f"{p.label}: request {self.rid}: more tokens than asked for", p.tail())
