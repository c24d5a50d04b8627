"""Where the noise of llama-server's pairs comes from (#38): two llama-servers of the same build, each asked
the same timed continuation (a prompt prefilled untimed, then one new token and `--tokens` more, cached
prompt, answered whole), in turns of `--slice` seconds (the idle one stopped, as the harness's freezer does)
or one after the other (`--slice 0`). For every request it keeps four clocks side by side:

- wall: the time the request's server was running (its turns) until the answer came;
- cpu: the server's CPU time over the request, every thread (schedstat, nanoseconds);
- server: llama-server's own `timings` (`predicted_ms` + `prompt_ms`), and `prompt_n` (how many prompt
  tokens it evaluated again: 1 when its cache held the prompt);
- threads: which of the server's threads the CPU time went to (the compute thread against the HTTP ones).

Each clock's pair log-ratios (A against B) then say which clock carries the spread, and so where it is made.

    python bench/llama_turns.py --server .demo-llama/work/venvs/<v>/tree/build/bin/llama-server \
        --model qwen2.5-coder-0.5b.gguf --ctx 128 --pairs 16 --slice 0.25 --out turns.json

Nothing else may run on the box meanwhile. Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def task_cpu_ns(pid: int) -> dict[str, int]:
    """CPU nanoseconds of every thread of pid, by thread name and id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            name = (task / "comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        out[f"{name}/{task.name}"] = ns
    return out


class Server:
    def __init__(self, binary: str, model: str, ctx: int, cpu: int | None):
        self.port = free_port()
        argv = [
            binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-m",
            model,
            "-c",
            str(ctx),
            "-np",
            "1",
            "-t",
            "1",
            "-tb",
            "1",
            "--no-webui",
        ]
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu), *argv]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.post_get("/health") == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("llama-server did not become healthy")

    def post_get(self, path: str) -> int:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status

    def complete(self, body: dict) -> dict:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return json.loads(r.read())

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.cont()
        self.proc.terminate()
        self.proc.wait(10)


def body(prompt: list[int], n: int) -> dict:
    return {
        "prompt": prompt,
        "n_predict": n,
        "top_k": 1,
        "temperature": 0,
        "cache_prompt": True,
        "stream": False,
        "return_tokens": True,
        "ignore_eos": True,
    }


def timed_pair(servers: list[Server], prompt: list[int], tokens: int, slice_s: float) -> list[dict]:
    """The same continuation to each server in turns of slice_s (0: one after the other)."""
    for s in servers:
        s.complete(body(prompt, 0))  # the prompt into each server's cache, untimed
    first = [s.complete(body(prompt, 1))["tokens"][0] for s in servers]  # the first decode token, untimed
    for s in servers:
        s.complete(body(prompt, 0))
    results: list[dict | None] = [None] * len(servers)
    for s in servers:
        s.stop()
    before = [task_cpu_ns(s.proc.pid) for s in servers]
    active = [0.0] * len(servers)

    def ask(i: int) -> None:
        results[i] = servers[i].complete(body([*prompt, first[i]], tokens))

    # the harness's schedule.run_sliced, over plain HTTP servers (it drives evalbot.serve/1 processes)
    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(servers))]
    turn = 0
    while any(r is None for r in results):
        i = turn % len(servers)
        turn += 1
        if results[i] is not None:
            continue
        servers[i].cont()
        t0 = time.monotonic()
        if threads[i].ident is None:  # its request goes out at its first turn
            threads[i].start()
        last = sum(r is None for r in results) == 1
        end = None if (last or slice_s <= 0) else t0 + slice_s
        while results[i] is None and (end is None or time.monotonic() < end):
            threads[i].join(0.002 if end is None else max(0.0, min(0.002, end - time.monotonic())))
        active[i] += time.monotonic() - t0
        servers[i].stop()
    after = [task_cpu_ns(s.proc.pid) for s in servers]
    for s in servers:
        s.cont()
    out = []
    for i, r in enumerate(results):
        assert r is not None
        t = r.get("timings", {})
        threads_ns = {
            k: after[i][k] - before[i].get(k, 0) for k in after[i] if after[i][k] - before[i].get(k, 0) > 0
        }
        out.append(
            {
                "wall_s": active[i],
                "cpu_s": sum(threads_ns.values()) / 1e9,
                "server_s": (t.get("predicted_ms", 0) + t.get("prompt_ms", 0)) / 1e3,
                "predicted_ms": t.get("predicted_ms"),
                "prompt_n": t.get("prompt_n"),
                "predicted_n": t.get("predicted_n"),
                "threads_s": {k: v / 1e9 for k, v in sorted(threads_ns.items(), key=lambda kv: -kv[1])[:6]},
            }
        )
    return out


def spread(pairs: list[list[dict]], key: str) -> dict[str, float]:
    lr = [math.log(p[0][key] / p[1][key]) for p in pairs if p[0][key] and p[1][key]]
    med = statistics.median(lr)
    mad = statistics.median(abs(x - med) for x in lr)
    return {
        "sd_pct": 100 * statistics.stdev(lr),
        "robust_sd_pct": 100 * 1.4826 * mad,
        "mean_pct": 100 * statistics.fmean(lr),
        "max_abs_pct": 100 * max(abs(x) for x in lr),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--server-b", help="the second server's binary (default: the same)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--slice", type=float, default=0.25)
    ap.add_argument("--pin", action="store_true", help="server A on vCPU 0, B on vCPU 1")
    ap.add_argument("--same-cpu", type=int, help="both servers on this vCPU, this script on the others")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    cpus = (0, 1) if a.pin else (a.same_cpu, a.same_cpu)
    servers = [
        Server(a.server, a.model, 2 * a.ctx + 64, cpus[0]),
        Server(a.server_b or a.server, a.model, 2 * a.ctx + 64, cpus[1]),
    ]
    if a.same_cpu is not None:  # every thread of this script off the servers' vCPU
        rest = os.sched_getaffinity(0) - {a.same_cpu}
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), rest)
    pairs = []
    try:
        for k in range(a.pairs):
            prompt = [rng.randrange(200, 30000) for _ in range(a.ctx)]
            order = servers if k % 2 == 0 else servers[::-1]  # ABBA: who runs first alternates
            got = timed_pair(order, prompt, a.tokens, a.slice)
            got = got if k % 2 == 0 else got[::-1]
            pairs.append(got)
            print(
                f"pair {k}: "
                + "  ".join(
                    f"{'AB'[i]} wall {g['wall_s']:.3f} cpu {g['cpu_s']:.3f} server {g['server_s']:.3f} "
                    f"prompt_n {g['prompt_n']}"
                    for i, g in enumerate(got)
                ),
                flush=True,
            )
    finally:
        for s in servers:
            s.close()
    summary = {k: spread(pairs, k) for k in ("wall_s", "cpu_s", "server_s")}
    for k, v in summary.items():
        print(
            f"{k}: pair sd {v['sd_pct']:.2f}% (robust {v['robust_sd_pct']:.2f}%), mean {v['mean_pct']:+.2f}%, "
            f"largest {v['max_abs_pct']:.1f}%"
        )
    Path(a.out).write_text(json.dumps({"args": vars(a), "pairs": pairs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
