"""Holding a serving process's whole tree still while the other side is timed, and what it may show then.

By the kernel's cgroup v2 freezer on the engine's own cgroup, which nothing inside can undo, or where the box
gives none, by SIGSTOP to every process in the tree (repeated until no new one appears; a process can
arrange to be resumed, and the report says this mode was used). The CPU a frozen tree may still show (the
meter's resolution and the kernel's late accounting) is `cpu_allowance_ns`; what the tree used or wrote
past it is checked by the process at its thaw (`served.ServedProcess.thaw`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from evalbot.evaluate import box, cpumeter

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


def freezer_of(meter: cpumeter.Meter | None) -> cpumeter.CgroupMeter | None:
    """The meter's cgroup freezer, where it has one."""
    return meter if isinstance(meter, cpumeter.CgroupMeter) and meter.freezer else None


def mode(meter: cpumeter.Meter | None) -> str:
    """How a tree so metered is frozen: the kernel's cgroup v2 freezer on its own cgroup, or (where the box
    gives none) SIGSTOP to every process of its tree, which a process can arrange to undo."""
    return FREEZER if freezer_of(meter) is not None else SIGSTOP_MODE


def stop_tree(root_pid: int, meter: cpumeter.Meter | None) -> int:
    """Stop the whole tree under `root_pid` and return when it began (monotonic ns). With the cgroup freezer
    every task stops at once and the kernel confirms it (OSError where it does not); otherwise SIGSTOP goes
    to the tree (again until no new process appears) and the tree is waited on until every process shows
    stopped."""
    freezer = freezer_of(meter)
    if freezer is not None:
        at = time.monotonic_ns()
        freezer.freeze()
        return at
    stopped: set[int] = set()
    at = 0
    for _ in range(8):
        fresh = _pids(root_pid) - stopped
        if not fresh:
            break
        at = at or time.monotonic_ns()
        for pid in fresh:
            _signal(pid, signal.SIGSTOP)
        stopped |= fresh
    at = at or time.monotonic_ns()
    _await_stopped(stopped)
    return at


def resume_tree(root_pid: int, meter: cpumeter.Meter | None) -> int:
    """Let the tree run again; returns when it was let go (monotonic ns)."""
    at = time.monotonic_ns()
    freezer = freezer_of(meter)
    if freezer is not None:
        with contextlib.suppress(OSError):
            freezer.thaw()
    else:
        for pid in _pids(root_pid):
            _signal(pid, signal.SIGCONT)
    return at


def frozen_cpu_ns(meter: cpumeter.Meter | None, read: Callable[[], int]) -> int:
    """The frozen tree's CPU time (`read`, -1 where not metered), to be compared at the thaw: frozen by the
    kernel, nothing in the tree can run, and what its reading gains is late accounting, so it is taken once
    it holds still; under SIGSTOP a process can arrange to run again, so it is taken at once."""
    return settled_cpu_ns(read) if freezer_of(meter) is not None else read()


def settled_cpu_ns(read: Callable[[], int]) -> int:
    """The frozen tree's CPU time once the kernel has charged all of it: read again every
    SETTLE_WINDOW_S until two readings agree (a tree that keeps running, which one the kernel froze
    cannot, stops the wait at SETTLE_LIMIT_S and is then caught at the thaw)."""
    last = read()
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while last >= 0 and time.monotonic() < deadline:
        time.sleep(SETTLE_WINDOW_S)
        now = read()
        if now == last:
            break
        last = now
    return last


def cpu_allowance_ns(meter: cpumeter.Meter | None) -> int:
    """The CPU a frozen tree may show at its thaw: twice the meter's resolution, the grace, and with the
    cgroup freezer the kernel's late accounting."""
    resolution = meter.resolution_ns if meter is not None else 0
    lag = FREEZER_LAG_NS if freezer_of(meter) is not None else 0
    return 2 * resolution + FROZEN_CPU_GRACE_NS + lag


def _pids(root_pid: int) -> set[int]:
    return box.tree(box.cpu_snapshot().procs, root_pid)


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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
