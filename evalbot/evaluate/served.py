"""Engines measured as serving processes, started as the rules' engine.yaml declares: the process, its
reader, its protocol.

Each side runs as a warm serving process (loaded and warmed once), sandboxed like every engine run. The
kernel timestamps each write the engine makes on its stdout (a socket, `stamped`), and a line arrives when
the write that ends it was made, however late the harness's reader thread reads it, so
prefill is the time from sending a request to its first token and decode is first token to last
(`timed.Timed`): nothing the engine says about time decides anything. While one side is timed, the other
side's whole process tree is frozen (`freezing`; who runs when: `schedule`), so a side cannot slow the other
down between its own requests, nor work off its own clock. However it is frozen, the tree's CPU time and
the bytes it has written to its stdout (those the harness read and those still in the pipe) are counted
here at the freeze and at the thaw, and CPU used in between, or a byte written in between, is the side's failure
(stage 'frozen'). Byte counts, not arrival times: a line written just before the freeze and read late by a
busy harness is no failure.

Every line is checked: an unknown id, a token outside the vocabulary, a line over the size cap, or
output that is not the protocol is the side's failure (`ServeError`), with the stderr tail.
"""

from __future__ import annotations

import array
import collections
import contextlib
import fcntl
import json
import queue
import select
import socket
import termios
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from evalbot.evaluate import cpumeter, device_idle, freezing, pinning, sandbox, stamped
from evalbot.evaluate.pending import Pending
from evalbot.evaluate.serve_error import ServeError
from evalbot.evaluate.timed import Line, Timed

PROTOCOL = "evalbot.serve/1"
MAX_LINE_BYTES = 1 << 20
MAX_EMPTY_WRITES = 10_000
STDERR_TAIL_BYTES = 64 << 10


@dataclass
class ServedProcess:
    """One serving engine process and the threads that read it."""

    label: str
    proc: Any  # subprocess.Popen[bytes]
    vocab: int = 0
    ready: dict[str, Any] = field(default_factory=dict)
    lines: queue.Queue[Line | ServeError | None] = field(default_factory=queue.Queue)
    stderr_tail: collections.deque[bytes] = field(default_factory=lambda: collections.deque(maxlen=256))
    stderr_reader: threading.Thread | None = None
    frozen: bool = False
    broken: bool = False  # it broke the protocol (or ran out of time): close() does not wait on it
    max_output_bytes: int = 64 << 20
    meter: cpumeter.Meter | None = None
    protocol: str = PROTOCOL  # the one its ready line must name (the rules' engine.yaml)
    # on a GPU profile, the harness's idle probe: every freeze waits for the device to run what the
    # process left queued (device_idle), and a process that keeps it busy past the limit fails
    device: device_idle.Probe | None = None
    # when the device was found idle after the last freeze, where it was still busy then (monotonic ns;
    # 0: idle at once, or no probe)
    device_idle_ns: int = 0
    # the CPUs the harness pinned the tree to (`pin`), and how: pinning.CPUSET (the kernel holds it) or
    # pinning.AFFINITY (each task's affinity, checked at every thaw); empty: not pinned
    pinned: frozenset[int] = frozenset()
    pinned_by: str = ""
    _count: int = 0
    _frozen_cpu_ns: int = -1
    _written_at_freeze: int = -1  # bytes written to stdout when the freeze was confirmed; -1: not frozen
    _read_bytes: int = 0  # bytes the reader took from the stdout pipe
    _read_lock: threading.Lock = field(default_factory=threading.Lock)
    out: stamped.Channel | None = None  # the harness's end of the engine's stdout

    @classmethod
    def start(
        cls,
        label: str,
        spec: sandbox.SandboxSpec,
        argv: list[str],
        *,
        no_sandbox: bool,
        meter: cpumeter.Meter | None = None,
        protocol: str = PROTOCOL,
    ) -> ServedProcess:
        """Spawn the server and its reader threads (stdout lines timestamped, stderr kept as a tail); a
        process whose output passes the spec's cap is stopped at once. With a meter, the whole tree's CPU
        time is read as each line arrives (a cgroup meter is entered before the sandbox starts)."""
        out, theirs = stamped.open_pair()
        try:
            proc = sandbox.spawn(spec, argv, no_sandbox=no_sandbox, prefix=meter.wrap([]) if meter else (),
                                 stdout=theirs.fileno())  # fmt: skip
        except BaseException:
            out.close()
            raise
        finally:
            theirs.close()  # the engine holds it now: its end closes when the last of its tree exits
        if meter is not None:
            meter.root_pid = proc.pid
        sp = cls(label, proc, max_output_bytes=spec.limits.max_output_bytes, meter=meter, protocol=protocol,
                 out=out)  # fmt: skip
        threading.Thread(target=sp._read_stdout, daemon=True).start()
        sp.stderr_reader = threading.Thread(target=sp._read_stderr, daemon=True)
        sp.stderr_reader.start()
        return sp

    # -------------------------------------------------------------- reading (threads)

    def _read_stdout(self) -> None:
        try:
            self._read_lines()
        finally:
            if self.out is not None:  # read no more: a write of the engine's from now fails it
                with self._read_lock:  # not while a freeze or a thaw asks the socket what is queued
                    self.out.close()

    def _read_lines(self) -> None:
        """Read the engine's stdout one write at a time, each stamped by the kernel as it was written
        (`stamped`; the bytes taken are counted under the lock that freeze and thaw take to count what the
        engine has written), and split it into lines: a line arrives when the write that ends it did."""
        out = self.out
        assert out is not None
        poller = select.poll()
        poller.register(out.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        buf = bytearray(out.max_message + 1)
        pending = bytearray()
        consumed = 0  # bytes of the stream up to the end of the last whole line
        empty = 0  # empty writes (an empty message each): nothing to read, counted so a flood ends
        while True:
            poller.poll()
            with self._read_lock:
                try:
                    n, at, cut = out.receive(buf)
                except BlockingIOError:
                    continue
                except OSError:
                    n, at, cut = 0, time.monotonic_ns(), False
                self._read_bytes += n
                ended = n == 0 and self._stdout_closed(poller)
            cpu = self._cpu_ns()
            if cut:
                self._stop(
                    ServeError(
                        f"{self.label}: wrote more than {out.max_message} bytes in one write() to its stdout, "
                        "the most one write may carry (a socket the kernel timestamps; docs/protocol.md)",
                        stage="output",
                    )
                )
                return
            if n == 0 and not ended:
                empty += 1
                if empty > MAX_EMPTY_WRITES:
                    self._stop(ServeError(f"{self.label}: made more than {MAX_EMPTY_WRITES} empty writes to "
                                          "its stdout", stage="output"))  # fmt: skip
                    return
                continue
            if n == 0:
                if pending and not self._take_line(bytes(pending), consumed + len(pending), at, cpu):
                    return
                self.lines.put(None)
                return
            pending += buf[:n]
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

    def _stdout_closed(self, poller: select.poll) -> bool:
        """After an empty read: whether the engine's end is closed with nothing left to read (an empty
        message from a live engine reads the same)."""
        if self._unread() != 0:
            return False
        return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))

    def _unread(self) -> int:
        """Bytes queued on the engine's stdout and not yet read (every queued message: FIONREAD); -1 where it
        cannot be asked."""
        if self.out is None:
            return -1
        try:
            unread = array.array("i", [0])
            fcntl.ioctl(self.out.fileno(), termios.FIONREAD, unread, True)
        except (OSError, ValueError):
            return -1
        return unread[0]

    def _written_bytes(self) -> int:
        """Bytes the engine has written to its stdout so far: those read, and those still queued; -1 where
        the socket cannot be asked."""
        with self._read_lock:
            unread = self._unread()
            return -1 if unread < 0 else self._read_bytes + unread

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

    def next_line(self, deadline: float, limit_s: float, until: float | None = None) -> Line | None:
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
            except Exception:
                code = None
            if self.stderr_reader is not None:  # its last words: what it wrote on stderr before it ended
                self.stderr_reader.join(timeout=2)
            tail = self.tail()
            too_long = "Message too long" in tail and self.out is not None
            raise ServeError(
                f"{self.label}: the serving process ended"
                + (f": it {describe(code)}" if code is not None else "")
                + (
                    f" (its stderr says a write failed: one write() to its stdout may carry at most "
                    f"{self.out.max_message} bytes; docs/protocol.md)"
                    if too_long and self.out is not None
                    else ""
                ),
                tail,
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
        line = self.next_line(time.monotonic() + timeout_s, timeout_s)
        assert line is not None  # no slice end: a line or ServeError
        obj = line.obj
        if obj.get("event") != "ready" or obj.get("protocol") != self.protocol:
            raise ServeError(
                f"{self.label}: expected a ready line of {self.protocol}, got {str(obj)[:200]}", self.tail()
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
        before = self.reading()
        steal0 = cpumeter.steal_ticks()
        sent = time.monotonic_ns()
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError as exc:
            self.next_line(time.monotonic() + 5, 5)  # the reason it stopped reading, when a reader saw one
            raise ServeError(
                f"{self.label}: cannot send a request: {exc}", self.tail(), stage="run"
            ) from None
        return Pending(self, body, req, rid, sent, before, steal0, time.monotonic() + timeout_s, timeout_s)

    def reading(self) -> cpumeter.Reading:
        if self.meter is None:
            return cpumeter.Reading(-1)
        try:
            return self.meter.read()
        except (OSError, ValueError):
            return cpumeter.Reading(-1)

    # -------------------------------------------------------------- freezing and ending

    @property
    def freeze_mode(self) -> str:
        """How this process is frozen (`freezing.mode`): the kernel's cgroup v2 freezer on its own cgroup,
        or SIGSTOP to every process of its tree, which a process can arrange to undo."""
        return freezing.mode(self.meter)

    @property
    def frozen_cpu_ns(self) -> int:
        """The tree's CPU time read at the last freeze (-1 where not metered)."""
        return self._frozen_cpu_ns

    def freeze(self, drain: bool = True) -> int:
        """Stop the whole process tree (`freezing.stop_tree`) and return when its work stopped (monotonic
        ns): when the freeze began, or with a GPU probe, when the device had run what the process left
        queued on it, if later (`device_idle_ns`). The tree's CPU time is read then (with the freezer, once
        the kernel's accounting of it holds still) and the bytes it has written, to be compared at thaw.
        ServeError (stage 'frozen') if the kernel does not confirm the freeze, or the device stays busy.
        Without `drain` the device is not asked (a block's start freezes every engine, then asks once)."""
        try:
            at = freezing.stop_tree(self.proc.pid, self.meter)
        except OSError as exc:
            self.broken = True
            raise ServeError(
                f"{self.label}: could not be frozen: {exc}", self.tail(), stage="frozen"
            ) from exc
        self._frozen_cpu_ns = freezing.frozen_cpu_ns(self.meter, self._cpu_ns)
        self._written_at_freeze = self._written_bytes()
        self.frozen = True
        self.device_idle_ns = 0
        if self.device is not None and drain:
            self._drain_device(at)
        return max(at, self.device_idle_ns)

    def _drain_device(self, at: int) -> None:
        """Wait for the device to run what this (now frozen) process left queued on it, and keep when it
        was found idle: the request it answered ends there. ServeError (stage 'frozen') past the limit."""
        assert self.device is not None
        drain = self.device.drain(device_idle.DRAIN_LIMIT_S)
        self.device_idle_ns = max(at, drain.idle_at_ns) if drain.busy_ns > 0 else 0
        if not drain.idle:
            self.broken = True
            raise ServeError(
                f"{self.label}: the GPU stayed busy for more than {device_idle.DRAIN_LIMIT_S:g} s after "
                "the harness froze it: work it queued on the device and did not wait for runs while the "
                "other side is timed, and slows it",
                self.tail(),
                stage="frozen",
            )

    def _tasks(self) -> list[int]:
        """Every thread of the tree: the cgroup's processes where it has one (a process that left the tree
        by double fork is still in it), else the kernel's child lists from the root."""
        if isinstance(self.meter, cpumeter.CgroupMeter):
            with contextlib.suppress(OSError, ValueError):
                return sorted({t for pid in self.meter.pids() for t in pinning.tree_tasks(pid)})
        return pinning.tree_tasks(self.proc.pid)

    def pin(self, cpus: frozenset[int]) -> None:
        """Hold the whole tree to `cpus` from now on (module pinning): the cgroup's cpuset where the box gives
        one, and every task's affinity (threads made later inherit it). ServeError (stage 'pin') where the
        kernel refuses."""
        by_kernel = self.meter is not None and self.meter.pin(pinning.format_cpu_list(cpus))
        try:
            pinning.set_affinity(self._tasks(), cpus)
        except OSError as exc:
            raise ServeError(
                f"{self.label}: could not be pinned to CPUs {pinning.format_cpu_list(cpus)}: {exc}",
                self.tail(),
                stage="pin",
            ) from exc
        self.pinned = cpus
        self.pinned_by = pinning.CPUSET if by_kernel else pinning.AFFINITY

    def thaw(self, check: bool = True) -> int:
        """Let the tree run again; returns when it was let go (monotonic ns). With `check`, CPU the tree
        used while frozen, past `freezing.cpu_allowance_ns`, or bytes it wrote to its stdout, is the side's
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
        left = None
        if check and self.pinned and self.pinned_by != pinning.CPUSET:
            left = pinning.escaped(self._tasks(), self.pinned)
        self.frozen = False
        self._written_at_freeze = -1
        at = freezing.resume_tree(self.proc.pid, self.meter)
        if left is not None:
            self.broken = True
            raise ServeError(
                f"{self.label}: left the CPUs it was pinned to: {left}", self.tail(), stage="cpu"
            )
        if wrote > 0:
            self.broken = True
            raise self._wrote_while_frozen(wrote)
        allowed = freezing.cpu_allowance_ns(self.meter)
        if used > allowed:
            self.broken = True
            raise ServeError(
                f"{self.label}: its processes used {used / 1e6:.1f} ms of CPU while the harness held them "
                f"frozen ({self.freeze_mode}; allowed: the meter's resolution and the kernel's accounting, "
                f"{allowed / 1e6:.1f} ms): a frozen engine cannot run, so it arranged to",
                self.tail(),
                stage="frozen",
            )
        return at

    def _wrote_while_frozen(self, extra: int) -> ServeError:
        return ServeError(
            f"{self.label}: wrote {extra} bytes of protocol output while the harness held it frozen "
            f"({self.freeze_mode}): a frozen engine cannot write, so it arranged to",
            self.tail(),
            stage="frozen",
        )

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
            except Exception:
                pass
        sandbox.kill_tree(self.proc.pid)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)
        if self.meter is not None:
            if isinstance(self.meter, cpumeter.CgroupMeter):
                try:  # nothing of the engine outlives it: whatever its cgroup still holds is killed
                    if self.meter.pids():
                        self.meter.kill()
                except OSError:
                    pass
            self.meter.close()
        if self.out is not None:
            with contextlib.suppress(OSError):
                self.out.sock.shutdown(socket.SHUT_RDWR)  # the reader sees the end: its thread finishes


def describe(code: int) -> str:
    """How a serving process ended."""
    from evalbot.evaluate.exits import describe_exit

    return describe_exit(code)
