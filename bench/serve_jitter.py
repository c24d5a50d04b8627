"""Where the served A/B's request-to-request noise comes from: the engine, or the stream to the harness.

Starts one `python -m engine serve` process (a random-weight shape), sends N generate requests of fresh
prompts at one context, and times each request twice: by the arrival of its token lines in a reader thread
(as `evalbot/evaluate/served.py` does: first token to last), and by the engine's own `decode_s`. It also
keeps every inter-token gap, so stalls (a gap far above the median) show apart from a slow steady rate.

    python bench/serve_jitter.py --shape qwen3-8b --device cuda --ctx 4096 --tokens 128 256 512 --requests 12

Prints one JSON object (and writes it to --out): per token count, the CV of both timings, the gap
percentiles, and the share of the variance the longest gaps explain.
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


def _reader(stream, q: queue.Queue) -> None:
    for raw in stream:
        q.put((time.monotonic_ns(), raw))
    q.put(None)


def _request(proc, q: queue.Queue, rid: str, prompt: list[int], n: int) -> dict:
    proc.stdin.write(json.dumps({"id": rid, "op": "generate", "prompt_ids": prompt, "max_new": n}) + "\n")
    proc.stdin.flush()
    stamps = []
    while True:
        item = q.get(timeout=600)
        if item is None:
            raise RuntimeError("the serving process ended")
        t, raw = item
        obj = json.loads(raw)
        if obj.get("id") != rid:
            continue
        if "tok" in obj:
            stamps.append(t)
        elif obj.get("event") == "done":
            gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
            return {
                "harness_decode_s": (stamps[-1] - stamps[0]) / 1e9,
                "engine_decode_s": obj["timings"]["decode_s"],
                "gaps_ms": gaps,
            }
        elif obj.get("event") == "error":
            raise RuntimeError(obj.get("message"))


def _cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    max_seq = args.ctx + max(args.tokens) + 1
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "serve",
            "--random-weights",
            "--shape",
            args.shape,
            "--device",
            args.device,
            "--max-seq",
            str(max_seq),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    t0 = time.monotonic()
    while True:
        item = q.get(timeout=900)
        if item is None:
            raise SystemExit("the serving process ended before it was ready")
        ready = json.loads(item[1])
        if ready.get("event") == "ready":
            break
    vocab = ready["config"]["vocab_size"]
    rng = random.Random(11)
    result = {
        "shape": args.shape,
        "device": args.device,
        "ctx": args.ctx,
        "ready_s": round(time.monotonic() - t0, 1),
        "cuda_graph": ready.get("config", {}).get("cuda_graph"),
        "runs": {},
    }
    for n in args.tokens:
        rows = [
            _request(proc, q, f"r{n}-{i}", [rng.randrange(vocab) for _ in range(args.ctx)], n)
            for i in range(args.requests)
        ]
        h = [r["harness_decode_s"] for r in rows]
        e = [r["engine_decode_s"] for r in rows]
        gaps = [g for r in rows for g in r["gaps_ms"]]
        med = statistics.median(gaps)
        # the time each request lost to gaps over 2x the median: does it explain the spread?
        lost = [sum(g - med for g in r["gaps_ms"] if g > 2 * med) / 1e3 for r in rows]
        result["runs"][str(n)] = {
            "requests": len(rows),
            "harness_tok_s_mean": round((n - 1) / statistics.mean(h), 2),
            "harness_cv": round(_cv(h), 5),
            "engine_cv": round(_cv(e), 5),
            "gap_ms_median": round(med, 3),
            "gap_ms_p99": round(_pct(gaps, 0.99), 3),
            "gap_ms_max": round(max(gaps), 3),
            "stall_s_per_request": [round(x, 4) for x in lost],
            "harness_cv_without_stalls": round(_cv([a - b for a, b in zip(h, lost, strict=True)]), 5),
            "harness_decode_s": [round(x, 5) for x in h],
            "engine_decode_s": [round(x, 5) for x in e],
        }
        print(
            json.dumps({k: v for k, v in result["runs"][str(n)].items() if not isinstance(v, list)}),
            flush=True,
        )
    proc.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
