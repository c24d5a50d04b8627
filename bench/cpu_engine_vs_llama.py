"""CPU prefill/decode throughput of our engine and of llama-cpp-python on the same GGUF, same machine.

Both sides run as fresh processes, interleaved (ours, llama.cpp, ours, ...), so drift on a shared
machine hits both alike. Prints a markdown table for docs/benchmarks.md and the raw records as JSON.

    python bench/cpu_engine_vs_llama.py --model qwen2.5-coder-0.5b --ctx 128 512 --gen 32 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "engine" / "data" / "corpus.txt"


def run(module: str, model: str, ctx: int, gen: int, threads: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        module,
        "bench",
        "--model",
        model,
        "--ctx",
        str(ctx),
        "--gen",
        str(gen),
        "--runs",
        "1",
        "--threads",
        str(threads),
    ]
    if module == "evalbot.reference":  # the same text the engine tiles into its context
        cmd += ["--text-file", str(CORPUS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--ctx", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    sides = {"evalbot engine (fp32 torch)": "engine", "llama-cpp-python": "evalbot.reference"}
    results: dict[tuple[str, int], list[dict]] = {}
    for ctx in args.ctx:
        for r in range(args.rounds):
            for label, module in sides.items():
                rec = run(module, args.model, ctx, args.gen, args.threads)
                results.setdefault((label, ctx), []).append(rec)
                print(
                    f"ctx {ctx} round {r + 1}: {label}: prefill {rec['prefill_tps']:.1f} tok/s, "
                    f"decode {rec['decode_tps']:.2f} tok/s",
                    file=sys.stderr,
                )
    versions = {
        label: recs[0]["config"].get("torch") or recs[0]["config"].get("llama_cpp")
        for (label, _), recs in results.items()
    }
    print(
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, {args.threads} threads per side; {date.today()}; "
        f"model {args.model}; gen {args.gen}; {args.rounds} interleaved rounds, median (min–max).\n"
    )
    print("| engine | ctx | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|")
    for (label, ctx), recs in results.items():
        pre = [x["prefill_tps"] for x in recs]
        dec = [x["decode_tps"] for x in recs]
        print(
            f"| {label} ({versions[label]}) | {ctx} | {statistics.median(pre):.1f} ({min(pre):.1f}–{max(pre):.1f}) "
            f"| {statistics.median(dec):.2f} ({min(dec):.2f}–{max(dec):.2f}) |"
        )
    print(
        "\n<!-- raw: "
        + json.dumps(
            {
                f"{k[0]}@{k[1]}": [
                    {"prefill_tps": x["prefill_tps"], "decode_tps": x["decode_tps"]} for x in v
                ]
                for k, v in results.items()
            }
        )
        + " -->"
    )


if __name__ == "__main__":
    main()
