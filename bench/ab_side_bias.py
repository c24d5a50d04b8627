"""Is an A/A judge biased towards one side? The pairs of many A/A runs' logs (`evalbot calibrate` or
`evalbot evaluate` stderr: "block B ctx C pair P: main X tok/s, PR Y tok/s"), pooled, split by what could
carry a side's advantage: the context, which side opened the pair (main opens pair i of block b when
(i + b) is even, abtest._pair), the first block against the later ones, and the run.

    python bench/ab_side_bias.py LOG [LOG ...] [--json OUT]

Each run's mean log-ratio at a context is one figure (the pairs of one run share its processes and its
host's spell, so they are not independent); the t statistic over runs says whether the runs agree on a
bias. Equal code must read 0 within that noise at every split; a split that does not names what to look at.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from evalbot import calibrate

PAIR = re.compile(r"block (\d+) ctx (\d+) pair (\d+): main ([\d.]+) tok/s, PR ([\d.]+) tok/s")


def read_pairs(path: Path) -> list[dict]:
    """Every timed pair a log file names."""
    return read_pairs_from_text(path.read_text(errors="replace"), str(path))


def read_pairs_from_text(text: str, name: str = "log") -> list[dict]:
    """Every timed pair a log names, with its run (a calibrate log holds several, each opened by a
    "calibration run N/M" line)."""
    out: list[dict] = []
    run = 1
    for line in text.splitlines():
        m = re.search(r"calibration run (\d+)/\d+:", line)
        if m:
            run = int(m[1])
        m = PAIR.search(line)
        if m and float(m[4]) > 0 and float(m[5]) > 0:
            block, ctx, pair = int(m[1]), int(m[2]), int(m[3])
            out.append(
                {
                    "run": f"{name}#{run}",
                    "block": block,
                    "ctx": ctx,
                    "pair": pair,
                    "main_opens": (pair - 1 + block - 1) % 2 == 0,
                    "log_ratio": math.log(float(m[5]) / float(m[4])),
                }
            )
    return out


def summary(values: list[float]) -> dict:
    n = len(values)
    mean = statistics.fmean(values) if values else float("nan")
    sd = statistics.stdev(values) if n > 1 else float("nan")
    return {
        "n": n,
        "mean_pct": 100 * mean,
        "sd_pct": 100 * sd,
        "se_pct": 100 * sd / math.sqrt(n) if n > 1 else None,
    }


def analyse(pairs: list[dict]) -> dict:
    """Per context: the pooled pairs by split, and the runs' means with the t statistic across runs."""
    out: dict = {}
    for ctx in sorted({p["ctx"] for p in pairs}):
        at = [p for p in pairs if p["ctx"] == ctx]
        splits = {
            "all pairs": [p["log_ratio"] for p in at],
            "main opens": [p["log_ratio"] for p in at if p["main_opens"]],
            "PR opens": [p["log_ratio"] for p in at if not p["main_opens"]],
            "block 1": [p["log_ratio"] for p in at if p["block"] == 1],
            "later blocks": [p["log_ratio"] for p in at if p["block"] > 1],
        }
        per_run: dict[str, list[float]] = defaultdict(list)
        for p in at:
            per_run[p["run"]].append(p["log_ratio"])
        means = [statistics.fmean(v) for v in per_run.values()]
        # the runs' agreement judged as `evalbot calibrate` judges it (None with too few runs)
        bias = calibrate.side_bias([math.exp(m) for m in means])
        out[str(ctx)] = {
            "splits": {k: summary(v) for k, v in splits.items()},
            "runs": {
                **summary(means),
                "t": bias["t"] if bias else None,
                "t_needed": bias["t_needed"] if bias else None,
                "agreed": bias["agreed"] if bias else None,
                "means_pct": [round(100 * m, 3) for m in means],
            },
        }
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    pairs = [p for log in a.logs for p in read_pairs(log)]
    if not pairs:
        print("no timed pairs in these logs", file=sys.stderr)
        return 2
    got = analyse(pairs)
    for ctx, r in got.items():
        runs = r["runs"]
        t = (
            "n/a"
            if runs["t"] is None
            else f"{runs['t']:+.1f}, needs {runs['t_needed']:.1f}: "
            + ("a bias" if runs["agreed"] else "no bias")
        )
        print(
            f"ctx {ctx}: {runs['n']} runs, mean of run means {runs['mean_pct']:+.2f}% (sd {runs['sd_pct']:.2f}%, t {t})"
        )
        for name, s in r["splits"].items():
            print(f"    {name:<13} {s['n']:>4} pairs  mean {s['mean_pct']:+.2f}%  sd {s['sd_pct']:.2f}%")
    if a.json:
        a.json.write_text(json.dumps({"pairs": len(pairs), "contexts": got}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
