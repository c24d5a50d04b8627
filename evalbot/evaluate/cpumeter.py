"""CPU time of one serving engine's whole process tree, read by the harness from outside.

The harness-held second clock: the CPU time that the engine's processes consumed, which neither the
engine nor a descheduled VM can move (steal and time spent runnable but waiting are not in it). Where
the harness may make cgroups, each engine runs in a cgroup of its own and the kernel's accounting
counts every thread and child, however short-lived (cgroup v2 `cpu.stat` usage_usec, or v1
`cpuacct.usage` in nanoseconds); the sandbox mounts no cgroup filesystem, so nothing inside can
leave it. Elsewhere the meter sums utime + stime + cutime + cstime over the tree in /proc (clock
ticks, usually 10 ms). A meter says which it is and its resolution, so a report can show both.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evalbot.evaluate import box

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PREFIX = "evalbot-"
FREEZE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Reading:
    """The tree's CPU time and its switch counts at one moment."""

    cpu_ns: int
    voluntary_switches: int = 0
    involuntary_switches: int = 0


@dataclass
class CgroupMeter:
    """An engine's own cgroup: usage from the kernel's accounting (every task, exited ones included)."""

    path: Path
    version: int  # 1 (cpuacct) or 2
    kind: str = "cgroup"
    resolution_ns: int = 1000
    root_pid: int = 0
    joined: list[Path] = field(default_factory=list)  # further cgroups the process joins (a v1 cpu cap)
    cap_cores: float | None = None  # the CPU bandwidth the kernel holds the tree to, once capped

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """argv prefixed so that the process joins its cgroups before it execs (its children follow)."""
        joins = " && ".join(f'echo $$ > "{p / "cgroup.procs"}"' for p in [self.path, *self.joined])
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "evalbot-cgroup", *argv]

    def cap(self, cores: float, root: Path = CGROUP_ROOT) -> bool:
        """Hold the tree to `cores` CPUs' worth of time (CFS bandwidth over 100 ms periods): v2 `cpu.max` on
        its own cgroup where the cpu controller reaches it, else a v1 `cpu` cgroup of its own that the
        process joins as well. Call before the process starts; False where the box allows neither."""
        period = 100_000
        quota = max(1000, int(cores * period))
        try:
            if self.version == 2 and "cpu" in (self.path / "cgroup.controllers").read_text().split():
                (self.path / "cpu.max").write_text(f"{quota} {period}")
                self.cap_cores = cores
                return True
        except OSError:
            pass
        parent = _v1_cpu(root)
        if parent is None:
            return False
        path = parent / self.path.name
        try:
            path.mkdir()
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
            if not os.access(path / "cgroup.procs", os.W_OK):
                raise OSError("cannot join it")
        except OSError:
            _rmdir(path)
            return False
        self.joined.append(path)
        self.cap_cores = cores
        return True

    def pin(self, cpus: str) -> bool:
        """Hold every task of the cgroup to `cpus` (a kernel CPU list) by cgroup v2's cpuset, which nothing
        inside can widen; False where the cpuset controller does not reach this cgroup."""
        try:
            if self.version == 2 and "cpuset" in (self.path / "cgroup.controllers").read_text().split():
                (self.path / "cpuset.cpus").write_text(cpus)
                return True
        except OSError:
            pass
        return False

    def read_ns(self) -> int:
        """CPU nanoseconds used in the cgroup so far."""
        if self.version == 1:
            return int((self.path / "cpuacct.usage").read_text())
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1000
        raise OSError(f"{self.path}/cpu.stat has no usage_usec")

    def read(self) -> Reading:
        """CPU time and the tree's context switches (the switch counts come from /proc)."""
        return Reading(self.read_ns(), *_switches(self.root_pid))

    @property
    def freezer(self) -> bool:
        """Whether this cgroup can be frozen by the kernel (cgroup v2's `cgroup.freeze`): every task in
        it stops at once, and nothing inside can thaw it (the sandbox mounts no cgroup filesystem)."""
        return self.version == 2 and (self.path / "cgroup.freeze").exists()

    def freeze(self, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
        """Freeze every task in the cgroup and wait until `cgroup.events` says it is frozen; OSError if
        the kernel does not confirm it within timeout_s."""
        (self.path / "cgroup.freeze").write_text("1")
        deadline = time.monotonic() + timeout_s
        while "frozen 1" not in (self.path / "cgroup.events").read_text().splitlines():
            if time.monotonic() > deadline:
                raise OSError(f"the kernel did not report {self.path.name} frozen within {timeout_s:.0f} s")
            time.sleep(0.0002)

    def thaw(self) -> None:
        (self.path / "cgroup.freeze").write_text("0")

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]

    def kill(self) -> None:
        """SIGKILL everything left in the cgroup (`cgroup.kill` where the kernel has it)."""
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            (self.path / "cgroup.kill").write_text("1")
            return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, 9)

    def close(self) -> None:
        """Remove the cgroups once their processes are gone (a few tries: exit is not instant)."""
        for path in [self.path, *self.joined]:
            _rmdir(path)


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


@dataclass
class TreeMeter:
    """Fallback: the tree's CPU ticks from /proc (reaped children are in their parents' cutime/cstime)."""

    root_pid: int = 0
    kind: str = "proc-tree"
    resolution_ns: int = field(default_factory=lambda: 1_000_000_000 // os.sysconf("SC_CLK_TCK"))

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def read_ns(self) -> int:
        snap = box.cpu_snapshot()
        ticks = sum(snap.procs[p].ticks for p in box.tree(snap.procs, self.root_pid) if p in snap.procs)
        return ticks * self.resolution_ns

    def read(self) -> Reading:
        return Reading(self.read_ns(), *_switches(self.root_pid))

    freezer = False
    cap_cores: float | None = None

    def cap(self, cores: float, root: Path = CGROUP_ROOT) -> bool:
        """No cgroup: nothing to cap with (the harness checks each request's CPU instead)."""
        return False

    def pin(self, cpus: str) -> bool:
        """No cgroup: no cpuset (the harness checks each task's affinity instead)."""
        return False

    def close(self) -> None:
        return None


Meter = CgroupMeter | TreeMeter


def parse_steal(text: str) -> int:
    """Steal ticks of all CPUs from /proc/stat's first line (0 where the kernel reports none)."""
    fields = text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("/proc/stat does not start with the 'cpu' line")
    return int(fields[8]) if len(fields) > 8 else 0


def steal_ticks(proc: Path = Path("/proc")) -> int:
    """The machine's steal so far, in clock ticks (time the hypervisor ran something else on our CPUs)."""
    try:
        return parse_steal((proc / "stat").read_text())
    except (OSError, ValueError):
        return 0


def _switches(root_pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches summed over the tree's threads (0, 0 if unreadable)."""
    if not root_pid:
        return 0, 0
    snap = box.cpu_snapshot()
    vol = inv = 0
    for pid in box.tree(snap.procs, root_pid):
        for task in _tasks(pid):
            try:
                text = (task / "status").read_text()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    inv += int(line.split()[1])
    return vol, inv


def _tasks(pid: int) -> list[Path]:
    try:
        return list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def _own_v2_cgroup(root: Path) -> Path | None:
    """This process's cgroup in the v2 hierarchy, if one is mounted at root (or root/unified)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if rel is None:
        return None
    for mount in (root, root / "unified"):
        if (mount / "cgroup.controllers").exists():
            return mount / rel.lstrip("/")
    return None


def _v1_cpuacct(root: Path) -> Path | None:
    for name in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
        if (root / name / "cpuacct.usage").exists():
            return root / name
    return None


def _v1_cpu(root: Path) -> Path | None:
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        if (root / name / "cpu.cfs_quota_us").exists():
            return root / name
    return None


def make_meter(label: str, *, root: Path = CGROUP_ROOT, prefer: str = "cgroup") -> Meter:
    """A cgroup meter where a cgroup can be made and entered here (v2, else v1 cpuacct), else /proc."""
    if prefer == "cgroup":
        name = f"{_PREFIX}{os.getpid()}-{label}-{time.monotonic_ns()}"
        for version, parent in ((2, _own_v2_cgroup(root)), (1, _v1_cpuacct(root))):
            if parent is None:
                continue
            path = parent / name
            try:
                path.mkdir()
            except OSError:
                continue
            meter = CgroupMeter(path, version)
            try:
                meter.read_ns()
                if os.access(path / "cgroup.procs", os.W_OK):
                    return meter
            except OSError:
                pass
            meter.close()
    return TreeMeter()


def sweep_stale(root: Path = CGROUP_ROOT) -> int:
    """Remove empty evalbot cgroups that a crashed harness left behind; returns how many."""
    removed = 0
    for parent in filter(None, (_own_v2_cgroup(root), _v1_cpuacct(root), _v1_cpu(root))):
        try:
            entries = list(parent.glob(f"{_PREFIX}*"))
        except OSError:
            continue
        for path in entries:
            pid = path.name[len(_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                try:
                    path.rmdir()
                    removed += 1
                except OSError:
                    pass
    return removed


def describe(meter: Meter) -> str:
    """What the meter reads, for reports: 'cgroup v2 (1 µs)' or 'proc-tree (10 ms)'."""
    res = meter.resolution_ns
    unit = f"{res // 1_000_000} ms" if res >= 1_000_000 else f"{res // 1000} µs"
    return f"cgroup v{meter.version} ({unit})" if isinstance(meter, CgroupMeter) else f"{meter.kind} ({unit})"
