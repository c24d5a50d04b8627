"""How much one fresh serving process differs from the next, under each engine environment.

The A/B's between-block variance is the sum of two sources: process offsets (a fresh process decodes a few
percent faster or slower than the next one, for its whole life: memory placement, page sizes, allocator
state) and the pairs' own noise. This probe separates them directly: it starts fresh serving processes one
at a time, cycling through the environments asked for (so drift of the box falls on all of them alike),
times `--requests` decode requests in each, and reports per environment the within-process sd of a
request's decode rate and the between-process sd of the process means (less what the within-process noise
explains).

    python bench/process_offsets.py --processes 8 --env base: --env thp:THP_MEM_ALLOC_ENABLE=1 --out offsets.json

With `--anchor`, each fresh process is timed against one long-lived anchor process (the base environment),
pair by pair, the idle one frozen (as the A/B does): the offsets are then log-ratios to the anchor, and
the box's drift over the run cancels. Each process also reports how much of its memory the kernel backs
with transparent huge pages (AnonHugePages of /proc/PID/smaps_rollup, with the tree's RSS).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalbot.evaluate import abtest, box, cpumeter, sandbox, schedule, served  # noqa: E402


def parse_env(text: str) -> tuple[str, dict[str, str]]:
    """`name:K=V,K=V` -> (name, {K: V}); the key NOASLR=1 runs the engine under `setarch -R`, and PIN=CPUS
    under `taskset -c CPUS`, instead of setting them in its environment."""
    name, _, rest = text.partition(":")
    pairs = [kv.split("=", 1) for kv in rest.split(",") if kv]
    return name, {k: v for k, v in pairs}


def split(per_process: list[list[float]]) -> dict[str, float]:
    """Within-process sd and between-process sd (of log rates), by one-way ANOVA."""
    logs = [[math.log(x) for x in xs] for xs in per_process if len(xs) >= 2]
    within = [x - statistics.fmean(v) for v in logs for x in v]
    dof = sum(len(v) - 1 for v in logs)
    sw2 = sum(x * x for x in within) / dof
    means = [statistics.fmean(v) for v in logs]
    n = statistics.fmean(len(v) for v in logs)
    sm2 = statistics.variance(means) if len(means) >= 2 else float("nan")
    return {
        "processes": len(logs),
        "requests_per_process": n,
        "within_sd": math.sqrt(sw2),
        "between_sd": math.sqrt(max(0.0, sm2 - sw2 / n)),
        "process_mean_sd": math.sqrt(sm2),
        "mean_rate": math.exp(statistics.fmean(means)),
    }


def hugepages(pid: int) -> dict[str, int]:
    """kB of the process's resident memory, and of it what transparent huge pages back."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "AnonHugePages"):
                out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument(
        "--shape", help="a real shape with random weights instead of --model (a box without the GGUF)"
    )
    ap.add_argument("--processes", type=int, default=8, help="per environment")
    ap.add_argument("--requests", type=int, default=6, help="timed requests per process")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument(
        "--threads", type=int, default=1, help="the engine's OMP_NUM_THREADS (the cpu profile: 1)"
    )
    ap.add_argument("--env", action="append", default=[], help="name:K=V,K=V (repeatable); default base:")
    ap.add_argument("--anchor", action="store_true", help="time each process against one long-lived anchor")
    ap.add_argument("--out")
    args = ap.parse_args()
    from evalbot.reference.registry import resolve

    model = None if args.shape else resolve(args.model)
    weights = (
        ["--random-weights", "--shape", args.shape, "--seed", "7"]
        if model is None
        else ["--model", str(model)]
    )
    envs = [parse_env(e) for e in (args.env or ["base:"])]
    work = Path(tempfile.mkdtemp(prefix="evalbot-offsets-"))
    rates: dict[str, list[list[float]]] = {name: [] for name, _ in envs}
    cpu_rates: dict[str, list[list[float]]] = {name: [] for name, _ in envs}
    t0 = time.monotonic()

    def start(name: str, extra: dict[str, str], scratch: Path) -> served.ServedProcess:
        scratch.mkdir()
        env = (
            sandbox.scrub_env(os.environ)
            | {
                "HOME": str(scratch),
                "TMPDIR": str(scratch),
                "PYTHONHASHSEED": "0",
                "OMP_NUM_THREADS": str(args.threads),
            }
            | extra
        )
        spec = sandbox.SandboxSpec(
            ro_binds=tuple(
                dict.fromkeys(
                    [*sandbox.system_ro_binds(), ROOT, Path(sys.prefix), *([model.parent] if model else [])]
                )
            ),
            scratch=scratch,
            workdir=ROOT,
            env=env,
            limits=sandbox.Limits(timeout_s=3600, memory_bytes=48 << 30),
        )
        prefix = ["setarch", os.uname().machine, "-R"] if extra.get("NOASLR") == "1" else []
        if extra.get("PIN"):
            prefix = ["taskset", "-c", extra["PIN"], *prefix]
        argv = [*prefix, sys.executable, "-m", "engine", "serve", *weights]
        argv += ["--max-seq", str(args.ctx + args.tokens + 16), "--warmup", "1"]
        p = served.ServedProcess.start(name, spec, argv, no_sandbox=True, meter=cpumeter.make_meter(name))
        p.wait_ready(900)
        return p

    anchor = start("anchor", {}, work / "anchor") if args.anchor else None
    if anchor is not None:
        anchor.freeze()
    huge: dict[str, list[dict[str, int]]] = {name: [] for name, _ in envs}
    for i in range(args.processes):
        for name, extra in envs:
            p = start(name, extra, work / f"{name}-{i}")
            try:
                huge[name].append(hugepages(p.proc.pid))
                source = abtest.random_prompts(p.vocab, 11)
                xs, cs = [], []
                for r in range(args.requests):
                    body = {
                        "op": "generate",
                        "prompt_ids": source(args.ctx, 1000 * i + r),
                        "max_new": args.tokens,
                    }
                    if anchor is None:
                        t = p.request(body, 600)
                        xs.append(t.decode_tps)
                        if t.decode_cpu_s:
                            cs.append((len(t.tokens) - 1) / t.decode_cpu_s)
                        continue
                    order = (p, anchor) if r % 2 == 0 else (anchor, p)
                    got = {
                        q.label: schedule.run_alone(
                            q, [x for x in order if x is not q], partial(q.request, body, 600)
                        )
                        for q in order
                    }
                    xs.append(got[name].decode_tps / got["anchor"].decode_tps)
                    if got[name].decode_cpu_s and got["anchor"].decode_cpu_s:
                        cs.append(got["anchor"].decode_cpu_s / got[name].decode_cpu_s)
            finally:
                p.close()
            rates[name].append(xs)
            cpu_rates[name].append(cs)
            print(
                f"{name} process {i + 1}: " + " ".join(f"{x:.4f}" for x in xs) + f" {huge[name][-1]}",
                file=sys.stderr,
            )
    if anchor is not None:
        anchor.close()
    result = {
        "date": box.now(),
        "box": box.identity(),
        "args": vars(args),
        "wall_s": round(time.monotonic() - t0, 1),
        "envs": {
            name: {
                "env": extra,
                "wall": split(rates[name]),
                "cpu": split(cpu_rates[name]) if all(len(c) >= 2 for c in cpu_rates[name]) else None,
                "rates": rates[name],
                "hugepages": huge[name],
            }
            for name, extra in envs
        },
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("| env | processes | requests each | tok/s | within-process sd | between-process sd |")
    print("|---|---|---|---|---|---|")
    for name, row in result["envs"].items():
        w = row["wall"]
        print(
            f"| {name} | {w['processes']} | {w['requests_per_process']:.0f} | {w['mean_rate']:.2f} | "
            f"{100 * w['within_sd']:.2f}% | {100 * w['between_sd']:.2f}% |"
        )


if __name__ == "__main__":
    main()
