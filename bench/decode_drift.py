"""How the box's noise on a decode rate depends on the time scale: the case for sliced pairs.

One engine decodes one token at a time for `--seconds` (fresh prompts of `--ctx` tokens, `--tokens` steps
each), and every step's time is kept. For windows of w consecutive steps the script prints the Allan
deviation: the sd of the difference between adjacent windows' mean log step time, over sqrt(2). White
noise falls as 1/sqrt(w); drift (another tenant's memory traffic, frequency) makes it flat or rising. A
pair that runs main's request and then the PR's compares two adjacent windows of a whole request (24 steps
here); a sliced pair (`measurement.slice_s`) compares many adjacent short windows, so where the deviation
rises with w, slicing at its minimum cancels the drift that whole requests suffer.

    python bench/decode_drift.py --seconds 150 --out drift.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=400, help="decode steps per prompt")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the cpu profile: 1)")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    from engine.generate import Session, load  # the bench may import the engine; the bot never does

    torch.set_num_threads(args.threads)
    model = load(args.model, max_pos=args.ctx + args.tokens + 8)
    session = Session(model, args.ctx + args.tokens + 8)
    rng = random.Random(0)
    times: list[float] = []
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        session.reset()
        session.forward([rng.randrange(1000, 30000) for _ in range(args.ctx)])
        for _ in range(args.tokens):
            t0 = time.perf_counter()
            session.forward([5])
            times.append(time.perf_counter() - t0)
    logs = [math.log(t) for t in times]
    step = statistics.fmean(times)
    rows = [
        {"window_steps": w, "window_s": round(w * step, 2), "allan": allan(logs, w)}
        for w in (1, 2, 4, 8, 16, 24, 48, 96, 192)
    ]
    print(f"{len(times)} steps of {1e3 * step:.1f} ms, {args.threads} thread(s), ctx {args.ctx}")
    print("| window (steps) | window (s) | Allan deviation |")
    print("|--:|--:|--:|")
    for r in rows:
        print(f"| {r['window_steps']} | {r['window_s']} | {100 * r['allan']:.2f}% |")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"args": vars(args), "step_s": step, "rows": rows, "times": times}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
