"""How the box's noise on a decode rate depends on the time scale, and what it is made of.

One engine decodes one token at a time for `--seconds` (fresh prompts of `--ctx` tokens, `--tokens` steps
each), and every step's time is kept. For windows of w consecutive steps the script prints the Allan
deviation: the sd of the difference between adjacent windows' mean log step time, over sqrt(2). White
noise falls as 1/sqrt(w); drift (another tenant's memory traffic, frequency) makes it flat or rising. A
pair that runs main's request and then the PR's compares two adjacent windows of a whole request (24 steps
here); a sliced pair (`measurement.slice_s`) compares many adjacent short windows, so where the deviation
rises with w, slicing at its minimum cancels the drift that whole requests suffer.

What a slow step is made of (#40, the CPU part), kept per step in `--out`:
- `cpu`: the thread's own CPU time (a step whose wall time outruns it was preempted in the guest);
- `probe`: after every step, a fixed compute-bound kernel that lives in L1 (`--probe-iters` 64x64 matmuls):
  it slows with the core's clock, a hypervisor's steal or an SMT sibling, and not with memory traffic;
- `steal`: the pinned CPU's steal ticks from /proc/stat, sampled about once a second;
- `anon_huge_kb`: how much of the process's memory transparent huge pages back, at the end.

    python bench/decode_drift.py --seconds 150 --out drift.json
    taskset -c 2 python bench/decode_drift.py --shape qwen2.5-0.5b --ctx 512 --seconds 120 --out d.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def allan(log_times: list[float], w: int) -> float:
    """Allan deviation of log step times at a window of w steps (NaN with fewer than 3 windows)."""
    means = [statistics.fmean(log_times[i : i + w]) for i in range(0, len(log_times) - w + 1, w)]
    if len(means) < 3:
        return float("nan")
    diffs = [b - a for a, b in itertools.pairwise(means)]
    return statistics.pstdev(diffs) / math.sqrt(2)


def steal_ticks(cpu: int | None, stat: str) -> int:
    """The steal column (the 8th number) of /proc/stat's line for `cpu` (the all-CPU line for None)."""
    name = "cpu" if cpu is None else f"cpu{cpu}"
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == name:
            return int(fields[8]) if len(fields) > 8 else 0
    raise ValueError(f"/proc/stat has no {name} line")


def anon_huge_kb() -> int | None:
    """AnonHugePages of this process (smaps_rollup), or None where the kernel does not say."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument(
        "--shape", help="a real shape with random weights instead of --model (a box without the GGUF)"
    )
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=400, help="decode steps per prompt")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the cpu profile: 1)")
    ap.add_argument(
        "--probe-iters", type=int, default=40, help="64x64 matmuls of the compute probe a step (0: none)"
    )
    ap.add_argument("--label", default="")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    from engine.generate import (  # the bench may import the engine; the bot never does
        Session,
        load,
        load_random,
    )

    torch.set_num_threads(args.threads)
    max_pos = args.ctx + args.tokens + 8
    model = (
        load_random(args.shape, "cpu", max_pos=max_pos) if args.shape else load(args.model, max_pos=max_pos)
    )
    session = Session(model, max_pos)
    pinned = sorted(os.sched_getaffinity(0))
    cpu = pinned[0] if len(pinned) == 1 else None
    rng = random.Random(0)
    small = torch.randn(64, 64)
    times: list[float] = []
    cpus: list[float] = []
    probes: list[float] = []
    starts: list[float] = []
    steal: list[tuple[float, int]] = []
    hz = os.sysconf("SC_CLK_TCK")
    t_origin = time.perf_counter()
    unix_origin = time.time()
    end = t_origin + args.seconds
    next_steal = t_origin
    while time.perf_counter() < end:
        session.reset()
        session.forward([rng.randrange(1000, 30000) for _ in range(args.ctx)])
        for _ in range(args.tokens):
            t0 = time.perf_counter()
            c0 = time.thread_time()
            session.forward([5])
            t1 = time.perf_counter()
            cpus.append(time.thread_time() - c0)
            times.append(t1 - t0)
            starts.append(t0 - t_origin)
            for _ in range(args.probe_iters):
                small @ small
            probes.append(time.perf_counter() - t1)
            if t1 >= next_steal:
                steal.append((t1 - t_origin, steal_ticks(cpu, Path("/proc/stat").read_text())))
                next_steal = t1 + 1.0
    logs = [math.log(t) for t in times]
    step = statistics.fmean(times)
    rows = [
        {"window_steps": w, "window_s": round(w * step, 2), "allan": allan(logs, w)}
        for w in (1, 2, 4, 8, 16, 24, 48, 96, 192)
    ]
    stolen = (steal[-1][1] - steal[0][1]) / hz if len(steal) > 1 else 0.0
    print(
        f"{len(times)} steps of {1e3 * step:.1f} ms, {args.threads} thread(s), ctx {args.ctx}, cpus {pinned}"
    )
    print(f"steal {stolen:.2f} s of {steal[-1][0] if steal else 0:.0f} s; AnonHugePages {anon_huge_kb()} kB")
    print("| window (steps) | window (s) | Allan deviation |")
    print("|--:|--:|--:|")
    for r in rows:
        print(f"| {r['window_steps']} | {r['window_s']} | {100 * r['allan']:.2f}% |")
    if args.out:
        record = {
            "args": vars(args),
            "cpus": pinned,
            "unix_origin": unix_origin,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("THP_", "OMP_", "MALLOC_"))},
            "step_s": step,
            "rows": rows,
            "anon_huge_kb": anon_huge_kb(),
            "steal_hz": hz,
            "steal": steal,
            "starts": starts,
            "times": times,
            "cpu": cpus,
            "probe": probes,
        }
        Path(args.out).write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
