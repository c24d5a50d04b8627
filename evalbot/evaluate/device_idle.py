"""The harness's side of the GPU idle probe (`gpu_probe.py`): one trusted probe process per GPU evaluation,
asked after every freeze of a serving process how long the device stayed busy (`Probe.drain`).

A frozen engine's host processes cannot run, but the kernels it queued before the freeze do, while the
other side is timed (#36). So a request ends when its answer has arrived and the device has run what its
engine left queued: the served process keeps when the device was found idle after its freeze
(`ServedProcess.freeze`), and that moment, where later than the answer, is the request's end on its wall
clock (`Timed.device_idle_ns`). An engine that keeps the device busy past the limit fails (stage 'frozen').
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE = Path(__file__).with_name("gpu_probe.py")
READY_TIMEOUT_S = 120.0  # the probe's CUDA start and its idle calibration
# past this, a frozen engine's queued work is no honest trailing step: the side fails (stage 'frozen')
DRAIN_LIMIT_S = 2.0


class ProbeError(RuntimeError):
    """The probe could not start or stopped answering: the box's fault, never a side's."""


@dataclass(frozen=True)
class Drain:
    """What one drain saw: whether the device went idle within the limit, and when (monotonic ns) the
    last busy round trip ended (the moment asked where the device was idle at once)."""

    idle: bool
    asked_ns: int
    busy_ns: int
    probes: int

    @property
    def idle_at_ns(self) -> int:
        return self.asked_ns + self.busy_ns


class Probe:
    """The running probe process; `drain` asks it, `close` ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], ready: dict, stderr: Any = None):
        self.proc = proc
        self.ready = ready
        self._stderr = stderr  # a file: a pipe nobody reads could fill and stall the probe
        self._buf = b""

    @classmethod
    def start(cls, python: str, env: dict[str, str] | None = None) -> Probe:
        """Start the probe with the trusted interpreter `python` (isolated: no PYTHONPATH, no user site)
        and wait for its ready line. ProbeError where it cannot (no torch, no CUDA, a crash)."""
        err = tempfile.TemporaryFile()  # noqa: SIM115 (the probe's, closed with it)
        try:
            proc = subprocess.Popen(
                [python, "-I", str(PROBE)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env if env is not None else dict(os.environ),
            )
        except OSError as exc:
            err.close()
            raise ProbeError(f"the GPU idle probe could not start: {exc}") from exc
        probe = cls(proc, {}, err)
        try:
            ready = probe._read(READY_TIMEOUT_S)
        except ProbeError:
            probe.close()  # a first line that is no JSON object: nobody else holds the process to end it
            raise
        if ready.get("event") != "ready":
            probe.close()
            raise ProbeError(f"the GPU idle probe's first line is not its ready line: {ready!r:.200}")
        probe.ready = ready
        return probe

    def drain(self, limit_s: float = DRAIN_LIMIT_S) -> Drain:
        """Ask how long the device stays busy from now (up to `limit_s`)."""
        asked = time.monotonic_ns()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"limit_ms": limit_s * 1e3}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise ProbeError(f"the GPU idle probe stopped taking requests: {exc}") from exc
        got = self._read(limit_s + 30.0)
        try:
            return Drain(bool(got["idle"]), asked, int(got["busy_ns"]), int(got["probes"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProbeError(f"the GPU idle probe answered {got!r:.200}") from exc

    def _read(self, timeout_s: float) -> dict:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise ProbeError(f"the GPU idle probe did not answer within {timeout_s:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                err = self._stderr_tail()
                self.close()
                raise ProbeError(f"the GPU idle probe exited ({self.proc.returncode}): {err}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ProbeError(f"the GPU idle probe wrote {line[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise ProbeError(f"the GPU idle probe wrote {line[:200]!r}")
        return obj

    def _stderr_tail(self) -> str:
        try:
            self.proc.wait(timeout=5)
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace").strip()[-600:]
        except (subprocess.TimeoutExpired, OSError, ValueError, AttributeError):
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout, self._stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
