"""The tables of `bench/cpu_judge_targets.sh`'s results, as docs/benchmarks.md holds them.

    python bench/cpu_judge_summary.py OUT_DIR

A/A runs (aaN.json, aaN.err): per run and context the scored clock's ratio, 95% CI and MDE, the pairs'
spread (sd of their wall-clock log ratios, from the log), the A/B's blocks, time and why it stopped, and
the verdict; then false tiers, false regressions, INCONCLUSIVE runs, the largest MDE, the mean A/A ratio
and a two-sided sign test of "the head came out faster" per context (on equal code the head should win
about half the time).
Evaluations (speedupN/, slowdownN/, gain3N/ with result.json): verdict, tier, the scored estimates, wall time.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path


def sign_test(wins: int, n: int) -> float:
    """Two-sided exact binomial p-value of `wins` heads in n fair tosses."""
    if n == 0:
        return 1.0
    k = min(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def aa_rows(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("aa*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)):
        err = path.with_suffix(".err")
        last = err.read_text().strip().splitlines()[-1] if err.exists() and err.read_text().strip() else ""
        verdict = last.split(": ", 2)[-1] if "calibration run" in last else f"failed: {last[-120:]}"
        try:
            data = json.loads(path.read_text() or "{}")
        except json.JSONDecodeError:
            data = {}
        per_ctx = {}
        for r in data.get("rows", []):
            d = r["details"]
            per_ctx[r["context"]] = (d["ratios"][0], *d["ci"][0], r["mde"], d.get("metric", "decode_tps"))
        log = err.read_text() if err.exists() else ""
        rows.append(
            {"run": int(re.sub(r"\D", "", path.stem)), "verdict": verdict, "ctx": per_ctx, **read_log(log)}
        )
    return rows


def read_log(log: str) -> dict:
    """The pairs' spread and the A/B's end, from an evaluation's progress lines."""
    ratios = [
        math.log(float(h) / float(b))
        for b, h in re.findall(r"ctx \d+ pair \d+: main ([\d.]+) tok/s, PR ([\d.]+) tok/s", log)
    ]
    end = re.search(r"A/B done after (\d+) blocks \((\d+) s\): (.*)", log)
    return {
        "pairs": len(ratios),
        "pair_sd": statistics.stdev(ratios) if len(ratios) >= 2 else None,
        "ab": f"{end.group(1)} blocks, {end.group(2)} s ({end.group(3)})" if end else "-",
    }


def print_aa(rows: list[dict]) -> None:
    if not rows:
        return
    contexts = sorted({c for r in rows for c in r["ctx"]})
    print(
        "| run | "
        + " | ".join(f"ctx {c} ratio [95% CI], MDE (clock)" for c in contexts)
        + " | pair sd | A/B | verdict |"
    )
    print("|---|" + "---|" * len(contexts) + "--:|---|---|")
    for r in rows:
        cells = []
        for c in contexts:
            if c in r["ctx"]:
                ratio, lo, hi, mde, metric = r["ctx"][c]
                cells.append(f"{ratio:.4f}x [{lo:.4f}, {hi:.4f}], {mde:.2%} ({metric})")
            else:
                cells.append("-")
        sd = f"{r['pair_sd']:.2%}" if r.get("pair_sd") is not None else "-"
        print(f"| {r['run']} | " + " | ".join(cells) + f" | {sd} | {r.get('ab', '-')} | {r['verdict']} |")
    verdicts = [r["verdict"] for r in rows]
    tiers = sum(v.startswith("PASS ") for v in verdicts)
    rejects = sum(v.startswith("REJECT") for v in verdicts)
    inconclusive = sum(v.startswith("INCONCLUSIVE") for v in verdicts)
    print(
        f"\nruns {len(rows)}: false tiers {tiers}, REJECT {rejects}, INCONCLUSIVE {inconclusive}, "
        f"other {len(rows) - tiers - rejects - inconclusive - sum(v == 'PASS' for v in verdicts)}"
    )
    for c in contexts:
        got = [r["ctx"][c] for r in rows if c in r["ctx"]]
        wins = sum(g[0] > 1.0 for g in got)
        mdes = sorted(g[3] for g in got)
        mean = math.exp(statistics.fmean(math.log(g[0]) for g in got)) - 1
        print(
            f"ctx {c}: mean ratio {mean:+.2%}; "
            f"head faster in {wins} of {len(got)} (sign test p = {sign_test(wins, len(got)):.3f}); "
            f"MDE median {mdes[len(mdes) // 2]:.2%}, max {mdes[-1]:.2%}; CIs covering 1.0: "
            f"{sum(g[1] <= 1.0 <= g[2] for g in got)} of {len(got)}"
        )


def print_evaluations(out: Path) -> None:
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    took = {
        m.group(1) + m.group(2): m.group(3)
        for m in re.finditer(r"(speedup|slowdown|gain3) (\d+): exit \d+ in (\d+) s", log)
    }
    for result in sorted(out.glob("*/result.json")):
        name = result.parent.name
        v = json.loads(result.read_text())["verdict"]
        shown = [e for e in v.get("estimates", []) if e.get("scored") or e.get("guarded")]
        est = "; ".join(
            f"ctx {e['context']} {e['metric']} {e['ratio']:.4f}x [{e['ci_low']:.4f}, {e['ci_high']:.4f}]"
            f"{' scored' if e.get('scored') else ''}"
            for e in shown
        )
        print(f"| {name} | {v['status']} {v.get('tier') or ''} | {est} | {took.get(name, '?')} s |")


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    print_aa(aa_rows(out))
    print()
    print_evaluations(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
