"""Can the harness see that a frozen engine's queued GPU work is still running? (#36 part 5)

Starts the harness's idle probe (`evalbot/evaluate/gpu_probe.py`) and a worker process that queues work on
the GPU without waiting for it, then is stopped with SIGSTOP (as the harness freezes an engine). Per case it
records what the probe's drain reported (busy_ns: how long the device stayed busy after the freeze) against
the work the worker queued, and the probe's round trips on an idle device. It also times a decode-like loop
in a third process while the frozen worker's work runs, to show what such work does to the side being timed,
and prints nvidia-smi's compute-apps list (pids as the box sees them).

    python bench/gpu_idle_probe.py --out docs/results/gpu_idle_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "evalbot" / "evaluate" / "gpu_probe.py"

WORKER = r"""
import json, sys, time, torch
dev = torch.device("cuda", 0)
a = torch.randn(256, 256, device=dev)
t0 = time.perf_counter(); torch.cuda._sleep(10_000_000); torch.cuda.synchronize(); per_cycle = (time.perf_counter() - t0) / 1e7
for _ in range(10): a @ a
torch.cuda.synchronize()
t0 = time.perf_counter(); [a @ a for _ in range(200)]; torch.cuda.synchronize(); mm = (time.perf_counter() - t0) / 200
print(json.dumps({"ready": True, "ns_per_cycle": per_cycle * 1e9, "mm_us": mm * 1e6}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "sleep":
        torch.cuda._sleep(int(cmd["ms"] / 1e3 / per_cycle))
    elif cmd["op"] == "small":
        for _ in range(int(cmd["ms"] / 1e3 / mm)):
            a @ a
    elif cmd["op"] == "sync_then":
        torch.cuda._sleep(int(cmd["ms"] / 1e3 / per_cycle)); torch.cuda.synchronize()
    elif cmd["op"] == "decode":
        x = torch.randn(1, 4096, device=dev); w = torch.randn(4096, 4096, device=dev)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(cmd["steps"]):
            for _ in range(8): x = torch.tanh(x @ w)
            x.sum().item()
        print(json.dumps({"decode_s": time.perf_counter() - t0}), flush=True); continue
    print(json.dumps({"queued": True}), flush=True)
"""


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def ask(p: subprocess.Popen, obj: dict) -> dict:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(json.dumps(obj) + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    probe = start([sys.executable, "-I", str(PROBE)])
    assert probe.stdout is not None
    ready = json.loads(probe.stdout.readline())
    idle = ready["idle_ns"]
    res: dict = {
        "idle_round_trip_us": {
            "median": statistics.median(idle) / 1e3,
            "p99": idle[int(0.99 * len(idle))] / 1e3,
            "max": idle[-1] / 1e3,
        },
        "quick_us": ready["quick_ns"] / 1e3,
        "cases": [],
    }
    print(json.dumps(res), flush=True)
    worker = start([sys.executable, "-c", WORKER])
    timed = start([sys.executable, "-c", WORKER])
    assert worker.stdout is not None and timed.stdout is not None
    res["worker"] = json.loads(worker.stdout.readline())
    json.loads(timed.stdout.readline())
    t0 = time.perf_counter()
    drains = [ask(probe, {"limit_ms": 1000}) for _ in range(200)]
    res["idle_drains"] = {
        "busy_ns_max": max(d["busy_ns"] for d in drains),
        "not_idle": sum(not d["idle"] for d in drains),
        "mean_cost_us": (time.perf_counter() - t0) / 200 * 1e6,
        "probes_max": max(d["probes"] for d in drains),
    }
    print(json.dumps(res["idle_drains"]), flush=True)
    base = [ask(timed, {"op": "decode", "steps": 100})["decode_s"] for _ in range(5)]
    res["decode_alone_s"] = statistics.median(base)
    for op, ms in [("sync_then", 50), ("sleep", 1), ("sleep", 5), ("sleep", 20), ("sleep", 100), ("small", 20),
                   ("small", 100), ("sleep", 1500)]:  # fmt: skip
        for r in range(a.repeats if ms < 1000 else 1):
            ask(worker, {"op": op, "ms": ms})
            os.kill(worker.pid, signal.SIGSTOP)
            t = time.perf_counter()
            d = ask(probe, {"limit_ms": 1000})
            wall = time.perf_counter() - t
            case = {"op": op, "queued_ms": ms, "repeat": r, **d, "drain_wall_ms": wall * 1e3}
            if r == 0 and ms < 1000:
                # the attack without the check: queue again, freeze, and time the other side at once
                os.kill(worker.pid, signal.SIGCONT)
                ask(worker, {"op": op, "ms": ms})
                os.kill(worker.pid, signal.SIGSTOP)
                case["decode_next_to_it_s"] = ask(timed, {"op": "decode", "steps": 100})["decode_s"]
            os.kill(worker.pid, signal.SIGCONT)
            time.sleep(0.05 if ms < 1000 else 0.8)
            res["cases"].append(case)
            print(json.dumps(case), flush=True)
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    res["compute_apps"] = apps.stdout.strip().splitlines()
    res["our_pids"] = {"probe": probe.pid, "worker": worker.pid, "timed": timed.pid}
    print(json.dumps({"apps": res["compute_apps"], "ours": res["our_pids"]}), flush=True)
    for p in (probe, worker, timed):
        p.kill()
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
