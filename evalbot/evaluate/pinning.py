"""Both serving engines of a block on the same CPUs (`measurement.pin`), and whether one left them.

Two engines that take turns on a box are compared fairly only where each turn runs on the same hardware. On a
VM a vCPU is a host thread whose speed is its own: its host core's other hyperthread, and whatever else the host
schedules there, slow it for seconds at a time. A one-thread engine that the guest's scheduler keeps on vCPU 0
and another kept on vCPU 1 draw two speeds for as long as they stay there: a difference between the sides that
turns do not cancel, because it is not the box's drift but the place. Pinned, both sides run on the same vCPUs
(the last `threads` of those the evaluation may use; the first are left to the harness's threads), so whatever
those are doing falls on both alike.

The pin is set from outside once a process is ready (its load may use every CPU): the kernel's cgroup v2
cpuset on the engine's own cgroup where the box gives one (nothing in the sandbox can change it), and every
task's affinity in any case. Without the cpuset a process could widen its own affinity again; every thaw then
reads each task's allowed CPUs first, and one that reaches past the pin fails its side.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

CPUSET = "cgroup v2 cpuset"
AFFINITY = "the CPU affinity of each task, checked at every thaw"


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a kernel CPU list such as '0-3,5' (Cpus_allowed_list, cpuset.cpus); ValueError if it
    is not one."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a < 0 or b < a:
            raise ValueError(f"not a CPU range: {part!r}")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """'0-3,5' for {0, 1, 2, 3, 5}."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def engine_cpus(usable: Iterable[int], threads: int) -> frozenset[int]:
    """The CPUs both engines are pinned to: the last `threads` of those the evaluation may use (all of them
    where there are no more), so the first ones stay the harness's."""
    ordered = sorted(set(usable))
    if not ordered:
        raise ValueError("no usable CPU")
    return frozenset(ordered[-max(1, threads) :])


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (an operator who pins evaluate with taskset pins its engines inside
    that set)."""
    return frozenset(os.sched_getaffinity(0))


def tree_tasks(root_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every thread of every process under root_pid (the root's included), from the kernel's child lists;
    processes that end meanwhile are left out."""
    seen: set[int] = set()
    tasks: list[int] = []
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = [int(t) for t in os.listdir(proc / str(pid) / "task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            tasks.append(tid)
            with contextlib.suppress(OSError, ValueError):
                todo.extend(
                    int(c) for c in (proc / str(pid) / "task" / str(tid) / "children").read_text().split()
                )
    return tasks


def set_affinity(tids: Sequence[int], cpus: frozenset[int]) -> None:
    """Every task of `tids` on `cpus` (one that has ended meanwhile is skipped); OSError where the kernel
    refuses one."""
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue


def allowed(tid: int, proc: Path = Path("/proc")) -> frozenset[int] | None:
    """The CPUs a task may run on now (its Cpus_allowed_list); None once it has ended."""
    try:
        text = (proc / str(tid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    return None


def escaped(tids: Iterable[int], cpus: frozenset[int], proc: Path = Path("/proc")) -> str | None:
    """What a tree did to leave its pin, for the side's failure: the first task allowed on CPUs outside
    `cpus`, or None where every task stays inside."""
    for tid in tids:
        got = allowed(tid, proc)
        if got is not None and not got <= cpus:
            return (
                f"its task {tid} may run on CPUs {format_cpu_list(got)}, but the harness pinned both engines "
                f"to {format_cpu_list(cpus)} (a task may narrow its affinity, never widen it)"
            )
    return None
