"""Engines measured through `python -m engine serve`: the harness holds the clock.

Each side runs as a warm serving process (loaded and warmed once), sandboxed like every engine run. The
trusted process timestamps each protocol line as it arrives (a reader thread, `time.monotonic_ns`), so
prefill is the time from sending a request to its first token and decode is first token to last:
nothing the engine says about time decides anything. While one side is timed, the other side's whole
process tree is frozen, so a side cannot slow the other down between its own requests, nor work off its
own clock: by the kernel's cgroup v2 freezer on the engine's own cgroup, which nothing inside can undo,
or where the box gives none, by SIGSTOP to every process in the tree (repeated until no new one appears;
a process can arrange to be resumed, and the report says this mode was used). Either way the tree's CPU
time and the bytes it has written to its stdout (those the harness read and those still in the pipe) are
counted at the freeze and at the thaw, and CPU used in between, or a byte written in between, is the
side's failure (stage 'frozen'). Byte counts, not arrival times: a line written just before the freeze
and read late by a busy harness is no failure.

Every line is checked: an unknown id, a token outside the vocabulary, a line over the size cap, or
output that is not the protocol is the side's failure, with the stderr tail.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import fcntl
import json
import os
import queue
import select
import signal
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalbot.evaluate import box, cpumeter, sandbox

PROTOCOL = "evalbot.serve/1"
FREEZER = "cgroup v2 freezer"
SIGSTOP_MODE = "SIGSTOP to each process"
FROZEN_CPU_GRACE_NS = 1_000_000  # CPU a frozen tree may show on top of twice the meter's resolution
# The kernel charges a task the time it ran since its last accounting when it leaves the CPU, which can
# come after the freeze is confirmed (seen on a CI box: an honest engine "used" 1.4 ms while frozen). With
# the cgroup freezer the reading the thaw is compared with is taken once it has held still this long (at
# most SETTLE_LIMIT_S).
SETTLE_WINDOW_S = 0.002
SETTLE_LIMIT_S = 0.05
# ... and, the kernel having frozen it, up to one scheduler tick (HZ=100) more is allowed for a charge that
# lands even later (a vCPU descheduled by its host at that moment): nothing in a frozen cgroup can run.
FREEZER_LAG_NS = 10_000_000
MAX_LINE_BYTES = 1 << 20
STDERR_TAIL_BYTES = 64 << 10


class ServeError(RuntimeError):
    """A serving process broke the protocol, died, flooded its output or ran out of time; `stage` says
    which (protocol, run, output, timeout, serve) and the message says how."""

    def __init__(self, message: str, tail: str = "", stage: str = "serve"):
        super().__init__(message)
        self.tail, self.stage = tail, stage


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
        """From the first token to the last, less the time the harness kept the process frozen."""
        first, last = self.arrivals_ns[0], self.arrivals_ns[-1]
        return (last - first - self._paused(first, last)) / 1e9

    @property
    def answer_s(self) -> float:
        """From sending the request to its summary line, less the time the harness kept it frozen (a
        prefill request's whole time)."""
        return (self.done_ns - self.sent_ns - self._paused(self.sent_ns, self.done_ns)) / 1e9

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
        decode of a continuation, whose every step comes after the harness sent what it depends on."""
        last = self.arrivals_ns[-1]
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


@dataclass
class ServedProcess:
    """One serving engine process and the threads that read it."""

    label: str
    proc: Any  # subprocess.Popen[bytes]
    vocab: int = 0
    ready: dict[str, Any] = field(default_factory=dict)
    lines: queue.Queue[Line | ServeError | None] = field(default_factory=queue.Queue)
    stderr_tail: collections.deque[bytes] = field(default_factory=lambda: collections.deque(maxlen=256))
    frozen: bool = False
    broken: bool = False  # it broke the protocol (or ran out of time): close() does not wait on it
    max_output_bytes: int = 64 << 20
    meter: cpumeter.Meter | None = None
    _count: int = 0
    _frozen_cpu_ns: int = -1
    _written_at_freeze: int = -1  # bytes written to stdout when the freeze was confirmed; -1: not frozen
    _read_bytes: int = 0  # bytes the reader took from the stdout pipe
    _read_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(
        cls,
        label: str,
        spec: sandbox.SandboxSpec,
        argv: list[str],
        *,
        no_sandbox: bool,
        meter: cpumeter.Meter | None = None,
    ) -> ServedProcess:
        """Spawn the server and its reader threads (stdout lines timestamped, stderr kept as a tail); a
        process whose output passes the spec's cap is stopped at once. With a meter, the whole tree's CPU
        time is read as each line arrives (a cgroup meter is entered before the sandbox starts)."""
        proc = sandbox.spawn(spec, argv, no_sandbox=no_sandbox, prefix=meter.wrap([]) if meter else ())
        if meter is not None:
            meter.root_pid = proc.pid
        sp = cls(label, proc, max_output_bytes=spec.limits.max_output_bytes, meter=meter)
        threading.Thread(target=sp._read_stdout, daemon=True).start()
        threading.Thread(target=sp._read_stderr, daemon=True).start()
        return sp

    # -------------------------------------------------------------- reading (threads)

    def _read_stdout(self) -> None:
        """Read the raw pipe (no buffered reader: the bytes taken from the kernel are counted, under the
        lock that freeze and thaw take to count what the engine has written) and split it into lines."""
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        pending = bytearray()
        consumed = 0  # bytes of the stream up to the end of the last whole line
        while True:
            poller.poll()
            with self._read_lock:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                self._read_bytes += len(chunk)
            at = time.monotonic_ns()
            cpu = self._cpu_ns()
            if not chunk:
                if pending and not self._take_line(bytes(pending), consumed + len(pending), at, cpu):
                    return
                self.lines.put(None)
                return
            pending += chunk
            while (nl := pending.find(b"\n")) >= 0:
                raw = bytes(pending[: nl + 1])
                del pending[: nl + 1]
                consumed += len(raw)
                if not self._take_line(raw, consumed, at, cpu):
                    return
            if len(pending) > MAX_LINE_BYTES or consumed + len(pending) > self.max_output_bytes:
                self._take_line(bytes(pending), consumed + len(pending), at, cpu)
                return

    def _take_line(self, raw: bytes, end: int, at: int, cpu: int) -> bool:
        """Check one line (`end`: its last byte's offset in the stream) and queue it; False once the side
        failed (the reader stops)."""
        if len(raw) > MAX_LINE_BYTES or end > self.max_output_bytes:
            self._stop(
                ServeError(
                    f"{self.label}: printed more than the {MAX_LINE_BYTES >> 20} MiB a protocol "
                    f"line or the {self.max_output_bytes >> 20} MiB a run may print, and was stopped",
                    stage="output",
                )
            )
            return False
        written = self._written_at_freeze
        if self.frozen and 0 <= written < end:
            self.broken = True
            self._stop(self._wrote_while_frozen(end - written))
            return False
        try:
            obj = json.loads(raw)
        except ValueError:
            self._stop(
                ServeError(
                    f"{self.label}: printed a line that is not the protocol: {raw[:120]!r}",
                    stage="protocol",
                )
            )
            return False
        if not isinstance(obj, dict):
            self._stop(
                ServeError(
                    f"{self.label}: printed a JSON {type(obj).__name__}, not an object", stage="protocol"
                )
            )
            return False
        self.lines.put(Line(at, obj, cpu))
        return True

    def _written_bytes(self) -> int:
        """Bytes the engine has written to its stdout so far: those read, and those still in the pipe
        (FIONREAD); -1 where the pipe cannot be asked."""
        with self._read_lock:
            try:
                unread = array.array("i", [0])
                fcntl.ioctl(self.proc.stdout.fileno(), termios.FIONREAD, unread, True)
            except (OSError, ValueError):
                return -1
            return self._read_bytes + unread[0]

    def _wrote_while_frozen(self, extra: int) -> ServeError:
        return ServeError(
            f"{self.label}: wrote {extra} bytes of protocol output while the harness held it frozen "
            f"({self.freeze_mode}): a frozen engine cannot write, so it arranged to",
            self.tail(),
            stage="frozen",
        )

    @property
    def frozen_cpu_ns(self) -> int:
        """The tree's CPU time read at the last freeze (-1 where not metered)."""
        return self._frozen_cpu_ns

    def _settled_cpu_ns(self) -> int:
        """The frozen tree's CPU time once the kernel has charged all of it: read again every
        SETTLE_WINDOW_S until two readings agree (a tree that keeps running, which one the kernel froze
        cannot, stops the wait at SETTLE_LIMIT_S and is then caught at the thaw)."""
        last = self._cpu_ns()
        deadline = time.monotonic() + SETTLE_LIMIT_S
        while last >= 0 and time.monotonic() < deadline:
            time.sleep(SETTLE_WINDOW_S)
            now = self._cpu_ns()
            if now == last:
                break
            last = now
        return last

    def _cpu_ns(self) -> int:
        if self.meter is None:
            return -1
        try:
            return self.meter.read_ns()
        except (OSError, ValueError):
            return -1

    def cpu_s(self) -> float | None:
        """CPU seconds the process tree has used since it started; None where it is not metered."""
        ns = self._cpu_ns()
        return ns / 1e9 if ns >= 0 else None

    def _read_stderr(self) -> None:
        size = total = 0
        for raw in iter(lambda: self.proc.stderr.read(65536), b""):
            self.stderr_tail.append(raw)
            size += len(raw)
            total += len(raw)
            while size > STDERR_TAIL_BYTES and len(self.stderr_tail) > 1:
                size -= len(self.stderr_tail.popleft())
            if total > self.max_output_bytes:
                self._stop(
                    ServeError(
                        f"{self.label}: printed more than {self.max_output_bytes >> 20} MiB on stderr "
                        "and was stopped",
                        stage="output",
                    )
                )
                return

    def _stop(self, error: ServeError) -> None:
        """Record why the process must end, and end it (a flood is stopped at the cap, not the time limit)."""
        self.lines.put(error)
        sandbox.kill_tree(self.proc.pid)

    def tail(self) -> str:
        """The end of what the process wrote on stderr."""
        return b"".join(self.stderr_tail).decode("utf-8", errors="replace")[-4000:]

    def _next(self, deadline: float, limit_s: float, until: float | None = None) -> Line | None:
        """The next line, or None once `until` (a slice's end, before the deadline) has passed."""
        wait_to = deadline if until is None else min(deadline, until)
        try:
            item = self.lines.get(timeout=max(wait_to - time.monotonic(), 0.0))
        except queue.Empty:
            if until is not None and until < deadline:
                return None
            sandbox.kill_tree(self.proc.pid)
            raise ServeError(
                f"{self.label}: no answer within {limit_s:.0f} s (the run time limit); stopped",
                self.tail(),
                stage="timeout",
            ) from None
        if item is None:
            try:
                code = self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                code = None
            raise ServeError(
                f"{self.label}: the serving process ended"
                + (f": it {describe(code)}" if code is not None else ""),
                self.tail(),
                stage="run",
            )
        if isinstance(item, ServeError):
            item.tail = self.tail()
            raise item
        return item

    # -------------------------------------------------------------- the protocol

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The ready line (identity, config, its own load and warm-up timings)."""
        try:
            return self._wait_ready(timeout_s)
        except ServeError:
            self.broken = True
            raise

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        line = self._next(time.monotonic() + timeout_s, timeout_s)
        assert line is not None  # no slice end: a line or ServeError
        obj = line.obj
        if obj.get("event") != "ready" or obj.get("protocol") != PROTOCOL:
            raise ServeError(
                f"{self.label}: expected a ready line of {PROTOCOL}, got {str(obj)[:200]}", self.tail()
            )
        vocab = (obj.get("config") or {}).get("vocab_size")
        if not isinstance(vocab, int) or vocab <= 0:
            raise ServeError(f"{self.label}: the ready line names no vocab_size", self.tail())
        self.ready, self.vocab = obj, vocab
        return obj

    def request(self, body: dict[str, Any], timeout_s: float) -> Timed:
        """Send one request and collect its lines until its summary; ServeError on anything else."""
        done = self.begin(body, timeout_s).collect()
        assert done is not None  # no slice end: collect returns the summary or raises
        return done

    def begin(self, body: dict[str, Any], timeout_s: float) -> Pending:
        """Send one request; its lines are collected by the Pending it returns."""
        try:
            return self._begin(body, timeout_s)
        except ServeError:
            self.broken = True
            raise

    def _begin(self, body: dict[str, Any], timeout_s: float) -> Pending:
        self._count += 1
        rid = f"{body['op'][0]}{self._count}"
        req = {**body, "id": rid}
        data = (json.dumps(req, separators=(",", ":")) + "\n").encode()
        before = self._reading()
        steal0 = cpumeter.steal_ticks()
        sent = time.monotonic_ns()
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError as exc:
            self._next(time.monotonic() + 5, 5)  # the reason it stopped reading, when a reader saw one
            raise ServeError(
                f"{self.label}: cannot send a request: {exc}", self.tail(), stage="run"
            ) from None
        return Pending(self, body, req, rid, sent, before, steal0, time.monotonic() + timeout_s, timeout_s)

    def _reading(self) -> cpumeter.Reading:
        if self.meter is None:
            return cpumeter.Reading(-1)
        try:
            return self.meter.read()
        except (OSError, ValueError):
            return cpumeter.Reading(-1)

    # -------------------------------------------------------------- freezing and ending

    def _pids(self) -> set[int]:
        return box.tree(box.cpu_snapshot().procs, self.proc.pid)

    @property
    def freeze_mode(self) -> str:
        """How this process is frozen: the kernel's cgroup v2 freezer on its own cgroup, or (where the box
        gives none) SIGSTOP to every process of its tree, which a process can arrange to undo."""
        return FREEZER if self._freezer() is not None else SIGSTOP_MODE

    def freeze(self) -> int:
        """Stop the whole process tree and return when it began (monotonic ns). With the cgroup freezer
        every task stops at once and the kernel confirms it; otherwise SIGSTOP goes to the tree (again
        until no new process appears) and the tree is waited on until every process shows stopped. The
        tree's CPU time is read then (with the freezer, once the kernel's accounting of it holds still),
        to be compared at thaw. ServeError (stage 'frozen') if the kernel
        does not confirm the freeze."""
        freezer = self._freezer()
        if freezer is not None:
            at = time.monotonic_ns()
            try:
                freezer.freeze()
            except OSError as exc:
                self.broken = True
                raise ServeError(
                    f"{self.label}: could not be frozen: {exc}", self.tail(), stage="frozen"
                ) from exc
        else:
            stopped: set[int] = set()
            at = 0
            for _ in range(8):
                fresh = self._pids() - stopped
                if not fresh:
                    break
                at = at or time.monotonic_ns()
                for pid in fresh:
                    _signal(pid, signal.SIGSTOP)
                stopped |= fresh
            at = at or time.monotonic_ns()
            _await_stopped(stopped)
        # frozen by the kernel, nothing in the tree can run: what its reading gains is late accounting.
        # Under SIGSTOP a process can arrange to run again, so the reading is taken at once.
        self._frozen_cpu_ns = self._settled_cpu_ns() if freezer is not None else self._cpu_ns()
        self._written_at_freeze = self._written_bytes()
        self.frozen = True
        return at

    def thaw(self, check: bool = True) -> int:
        """Let the tree run again; returns when it was let go (monotonic ns). With `check`, CPU the tree
        used while frozen, past the meter's resolution, or bytes it wrote to its stdout, is the side's
        failure (ServeError, stage 'frozen'): a frozen engine cannot run, so one that did arranged to (the
        tree is thawed either way). Both are counted before the tree is let go, so nothing it does after
        the thaw can count."""
        used, wrote = -1, 0
        if check and self._frozen_cpu_ns >= 0:
            now = self._cpu_ns()
            used = now - self._frozen_cpu_ns if now >= 0 else -1
        if check and self._written_at_freeze >= 0:
            now = self._written_bytes()
            wrote = now - self._written_at_freeze if now >= 0 else 0
        self.frozen = False
        self._written_at_freeze = -1
        at = time.monotonic_ns()
        freezer = self._freezer()
        if freezer is not None:
            try:
                freezer.thaw()
            except OSError:
                pass
        else:
            for pid in self._pids():
                _signal(pid, signal.SIGCONT)
        if wrote > 0:
            self.broken = True
            raise self._wrote_while_frozen(wrote)
        if used > self._frozen_cpu_allowance_ns():
            self.broken = True
            raise ServeError(
                f"{self.label}: its processes used {used / 1e6:.1f} ms of CPU while the harness held them "
                f"frozen ({self.freeze_mode}; allowed: the meter's resolution and the kernel's accounting, "
                f"{self._frozen_cpu_allowance_ns() / 1e6:.1f} ms): a frozen engine cannot run, so it "
                "arranged to",
                self.tail(),
                stage="frozen",
            )
        return at

    def _freezer(self) -> cpumeter.CgroupMeter | None:
        m = self.meter
        return m if isinstance(m, cpumeter.CgroupMeter) and m.freezer else None

    def _frozen_cpu_allowance_ns(self) -> int:
        resolution = self.meter.resolution_ns if self.meter is not None else 0
        lag = FREEZER_LAG_NS if self._freezer() is not None else 0
        return 2 * resolution + FROZEN_CPU_GRACE_NS + lag

    def close(self) -> None:
        """Ask it to stop, then end the whole tree (a process that broke the protocol is not asked: it
        would only be waited on for 5 s)."""
        if self.frozen:
            self.thaw(check=False)
        if not self.broken:
            try:
                self.proc.stdin.write(b'{"op":"shutdown"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - it is being killed anyway
                pass
        sandbox.kill_tree(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        if self.meter is not None:
            if isinstance(self.meter, cpumeter.CgroupMeter):
                try:  # nothing of the engine outlives it: whatever its cgroup still holds is killed
                    if self.meter.pids():
                        self.meter.kill()
                except OSError:
                    pass
            self.meter.close()


def _await_stopped(pids: set[int], timeout_s: float = 0.5) -> None:
    """Wait (briefly) until every pid that still exists shows the stopped state in /proc."""
    deadline = time.monotonic() + timeout_s
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                state = "gone"
            if state in ("T", "t", "gone", "Z", "X"):
                waiting.discard(pid)
        if waiting:
            time.sleep(0.0005)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe(code: int) -> str:
    """How a serving process ended."""
    from evalbot.evaluate.exits import describe_exit

    return describe_exit(code)


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
            line = p._next(self.deadline, self.timeout_s, until)
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
                after = p._reading()
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
    for other in [*others, *procs]:
        if not other.frozen:
            other.freeze()
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
            raise SliceError(i, exc) from exc
        finally:
            at = p.freeze()
        if result is None:
            pend.pause(at)
        else:
            done[i] = dataclasses.replace(result, cpu_frozen_ns=p.frozen_cpu_ns)
    return [d for d in done if d is not None]


def run_alone(timed: ServedProcess, others: list[ServedProcess], call: Callable[[], Timed]) -> Timed:
    """Run one timed request with every other serving process frozen, and freeze it again after (the
    request's CPU clock then ends at that freeze: Timed.cpu_frozen_ns)."""
    for other in others:
        if not other.frozen:
            other.freeze()
    if timed.frozen:
        timed.thaw()
    try:
        result = call()
    finally:
        timed.freeze()
    return dataclasses.replace(result, cpu_frozen_ns=timed.frozen_cpu_ns)
