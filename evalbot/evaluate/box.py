"""The measurement box: what it is, and whether anything but this evaluation is using it.

A busy box makes A/B pairs meaningless (another job on 2 cores gave per-pair ratios from -83% to
+275%), so evaluate measures only on a quiet one. Quiet is judged by what processes use, not by the
load average: the CPU time the whole machine spent busy (/proc/stat, which also catches processes too
short-lived to be seen, and a hypervisor's steal) less what this evaluation's own process tree spent
(/proc/<pid>/stat, reaped children included). Other processes are named by their command name only,
never by their arguments, which may hold anything.

Snapshots are I/O; everything that decides is a pure function of them, so the tests can feed it.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalbot import times
from evalbot.evaluate import sandbox
from evalbot.rules import Quiet

PROC = Path("/proc")
TOP_N = 3


class BoxBusy(RuntimeError):
    """The box stayed busy past the wait limit; the message names the top processes."""


@dataclass(frozen=True)
class ProcInfo:
    comm: str
    ppid: int
    ticks: int  # utime + stime + cutime + cstime: its own CPU and that of the children it reaped
    start: int  # start time in ticks after boot: tells a reused pid apart


@dataclass(frozen=True)
class CpuSnapshot:
    """The machine's busy ticks and every process's ticks at one moment."""

    at: float  # time.monotonic()
    busy: int  # all CPUs: user + nice + system + irq + softirq + steal, in ticks
    procs: dict[int, ProcInfo]


@dataclass(frozen=True)
class GpuState:
    """The GPU as nvidia-smi saw it: utilization and the compute processes on it (by name)."""

    util: float
    apps: tuple[str, ...]


@dataclass(frozen=True)
class Usage:
    """What others used between two snapshots: cores (CPU-seconds per second) and the top names."""

    window_s: float
    other_cores: float
    own_cores: float
    top: tuple[tuple[str, float], ...]  # (command name, cores), largest first
    gpu: GpuState | None = None

    def as_record(self) -> dict[str, Any]:
        """The box-state fields a report and a receipt carry."""
        rec: dict[str, Any] = {
            "other_cores": round(self.other_cores, 3),
            "window_s": round(self.window_s, 2),
            "others_top": [f"{n} {c:.2f}" for n, c in self.top],
        }
        if self.gpu is not None:
            rec |= {"gpu_util": self.gpu.util, "gpu_other_apps": list(self.gpu.apps)}
        return rec


# ---------------------------------------------------------------- reading /proc


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def parse_stat_busy(text: str) -> int:
    """Busy ticks of all CPUs from /proc/stat's first line (guest time is already inside user)."""
    fields = text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("/proc/stat does not start with the 'cpu' line")
    v = [int(x) for x in fields[1:]] + [0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return user + nice + system + irq + softirq + steal


def parse_proc_stat(text: str) -> ProcInfo:
    """One /proc/<pid>/stat line; the command name may hold spaces and parentheses."""
    left, right = text.find("("), text.rfind(")")
    comm = text[left + 1 : right]
    rest = text[right + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime..cstime are 14..17, starttime is 22
    ppid = int(rest[1])
    ticks = sum(int(x) for x in rest[11:15])
    return ProcInfo(comm=comm, ppid=ppid, ticks=ticks, start=int(rest[19]))


def cpu_snapshot(proc: Path = PROC) -> CpuSnapshot:
    """The machine's busy ticks and every visible process's ticks, now."""
    at = time.monotonic()
    busy = parse_stat_busy((proc / "stat").read_text())
    procs: dict[int, ProcInfo] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            procs[int(entry.name)] = parse_proc_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or unreadable
    return CpuSnapshot(at, busy, procs)


def gpu_state(ours: frozenset[int] = frozenset()) -> GpuState | None:
    """Utilization and compute processes of the first GPU, less this evaluation's own (`ours`: its engines,
    its idle probe), or None without nvidia-smi."""
    util = sandbox.run_trusted(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"], timeout_s=20
    )
    if util.returncode != 0 or not util.stdout.strip():
        return None
    apps = sandbox.run_trusted(
        ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"], timeout_s=20
    )
    names = others_on_gpu(apps.stdout, ours) if apps.returncode == 0 else ()
    try:
        value = float(util.stdout.split()[0])
    except (ValueError, IndexError):
        return None
    return GpuState(value, names)


def others_on_gpu(csv: str, ours: frozenset[int]) -> tuple[str, ...]:
    """The command names of nvidia-smi's compute apps (`pid, process_name` lines) that are not ours. Pure."""
    names = []
    for line in csv.splitlines():
        pid, _, name = line.partition(",")
        if not name.strip():
            continue
        try:
            if int(pid.strip()) in ours:
                continue
        except ValueError:
            pass  # "[N/A]" or "[Not Found]": not known to be ours
        names.append(Path(name.strip()).name)
    return tuple(names)


# ---------------------------------------------------------------- pure decisions


def tree(procs: dict[int, ProcInfo], root: int) -> set[int]:
    """root and every process descended from it."""
    children: dict[int, list[int]] = {}
    for pid, info in procs.items():
        children.setdefault(info.ppid, []).append(pid)
    out, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid in out or pid not in procs:
            continue
        out.add(pid)
        stack.extend(children.get(pid, ()))
    return out


def usage(
    a: CpuSnapshot, b: CpuSnapshot, root: int, hz: int | None = None, gpu: GpuState | None = None
) -> Usage:
    """What others and this evaluation (root's tree) used between snapshots a and b."""
    hz = hz or _clock_ticks()
    window = max(b.at - a.at, 1e-6)
    ours_a, ours_b = tree(a.procs, root), tree(b.procs, root)

    def own_ticks(snap: CpuSnapshot, ours: set[int]) -> int:
        return sum(snap.procs[p].ticks for p in ours)

    own = max(0, own_ticks(b, ours_b) - own_ticks(a, ours_a))
    other = max(0, (b.busy - a.busy) - own)
    by_name: dict[str, int] = {}
    for pid, info in b.procs.items():
        if pid in ours_b or pid in ours_a:
            continue
        before = a.procs.get(pid)
        delta = info.ticks - before.ticks if before is not None and before.start == info.start else info.ticks
        if delta > 0:
            by_name[info.comm] = by_name.get(info.comm, 0) + delta
    top = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_N]
    return Usage(
        window, other / hz / window, own / hz / window, tuple((name, t / hz / window) for name, t in top), gpu
    )


def busy_reason(u: Usage, limits: Quiet) -> str | None:
    """Why the box is not quiet (None when it is): CPU used by others, or a GPU in use by others."""
    parts = []
    if u.other_cores > limits.max_other_cores:
        named = ", ".join(f"{n} ({c:.2f})" for n, c in u.top) or "short-lived processes"
        parts.append(
            f"other processes used {u.other_cores:.2f} cores (limit {limits.max_other_cores:g}): {named}"
        )
    if u.gpu is not None and (u.gpu.util > limits.max_gpu_util or u.gpu.apps):
        apps = ", ".join(u.gpu.apps) or "no listed process"
        parts.append(
            f"the GPU is {u.gpu.util:.0f}% busy (limit {limits.max_gpu_util:g}%) with our engines "
            f"stopped: {apps}"
        )
    return "; ".join(parts) or None


# ---------------------------------------------------------------- waiting


def measure(
    root: int, window_s: float, *, with_gpu: bool, sleep: Callable[[float], None] = time.sleep
) -> Usage:
    """Sample for window_s and return what others used meanwhile."""
    a = cpu_snapshot()
    sleep(window_s)
    b = cpu_snapshot()
    return usage(a, b, root, gpu=gpu_state(frozenset(tree(b.procs, root))) if with_gpu else None)


def wait_until_quiet(
    limits: Quiet,
    *,
    with_gpu: bool,
    log: Callable[[str], None],
    root: int | None = None,
    sample: Callable[[], Usage] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Usage, float]:
    """The first quiet sample and the seconds waited for it; BoxBusy past limits.max_wait_s."""
    pid = os.getpid() if root is None else root
    take = sample or (lambda: measure(pid, limits.sample_s, with_gpu=with_gpu, sleep=sleep))
    start = clock()
    logged = False
    while True:
        u = take()
        reason = busy_reason(u, limits)
        if reason is None:
            return u, clock() - start
        waited = clock() - start
        if waited >= limits.max_wait_s:
            raise BoxBusy(f"box busy: {reason}; waited {waited:.0f} s (limit {limits.max_wait_s:g} s)")
        if not logged:
            log(f"box busy, waiting up to {limits.max_wait_s:g} s: {reason}")
            logged = True


# ---------------------------------------------------------------- identity


def identity() -> dict[str, Any]:
    """The machine the numbers came from."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "gpu": gpu_identity(),
    }


def state() -> dict[str, Any]:
    """The box right now: time, 1-minute load, and the GPU's clocks and temperature when there is one."""
    out: dict[str, Any] = {"at": now()}
    try:
        out["load1"] = round(os.getloadavg()[0], 2)
    except OSError:
        out["load1"] = None
    gpu = gpu_identity()
    if gpu:
        out |= {
            "gpu_clock_sm": gpu["clock_sm"],
            "gpu_clock_mem": gpu["clock_mem"],
            "gpu_temp": gpu["temperature"],
        }
    return out


def gpu_identity() -> dict[str, str] | None:
    """Name, driver, clocks and temperature of the first GPU, or None without nvidia-smi."""
    res = sandbox.run_trusted(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu",
            "--format=csv,noheader",
        ],
        timeout_s=20,
    )
    if res.returncode != 0 or not res.stdout.strip():
        return None
    name, driver, sm, mem, temp = (x.strip() for x in res.stdout.splitlines()[0].split(",")[:5])
    return {"name": name, "driver": driver, "clock_sm": sm, "clock_mem": mem, "temperature": temp}


def now() -> str:
    """UTC now, as the records write it (evalbot.times' one text form)."""
    return times.stamp()
