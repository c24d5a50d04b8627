"""What the step-time traces of `bench/decode_drift.py` say about a sliced pair's noise (#40, the CPU part).

For each trace:
- the slow steps (over 5% above the median) and what came with them: the thread preempted in the guest
  (wall time over its CPU time by 2 ms or more), the core itself slow (the L1 compute probe after the step
  over 1.5x its median), or neither (the memory system: another tenant's traffic, page walks);
- sliced A/A pairs simulated on the trace: the steps are dealt to two sides in turns of `slice_s` of
  decode time, a pair is `tokens` steps of each side, and its log-ratio is what the judge would read for
  two identical engines on this box; printed are the pairs' sd, their robust sd (1.4826 MAD) and their
  excess kurtosis, for several slice lengths.
With several traces taken at once on different CPUs, the correlation of their one-second mean log step
times says whether the box's slow spells are shared (the host) or each CPU's own.

    python bench/drift_analysis.py a.json b.json [--tokens 24] [--out summary.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def slow_steps(trace: dict) -> dict:
    """The steps over 5% above the median step, split by what came with them."""
    times, cpus, probes = trace["times"], trace["cpu"], trace["probe"]
    med, pmed = statistics.median(times), statistics.median(probes) if probes else 0.0
    slow = [i for i, t in enumerate(times) if t > 1.05 * med]
    pre = [i for i in slow if times[i] - cpus[i] >= 0.002]
    core = [i for i in slow if i not in pre and pmed and probes[i] > 1.5 * pmed]
    return {
        "steps": len(times),
        "median_ms": 1e3 * med,
        "slow": len(slow),
        "slow_preempted": len(pre),
        "slow_core": len(core),
        "slow_memory": len(slow) - len(pre) - len(core),
        "sd_log_step": statistics.pstdev(math.log(t) for t in times),
        "cpu_over_wall": sum(cpus) / sum(times),
        "probe_sd_log": statistics.pstdev(math.log(p) for p in probes) if probes else None,
    }


def sliced_pairs(times: list[float], slice_s: float, tokens: int) -> list[float]:
    """Log-ratios of simulated A/A pairs: steps dealt to sides A and B in turns of slice_s of step time;
    a pair is `tokens` steps of each side, consecutive in the trace."""
    sides: list[list[float]] = [[], []]
    turn, used, pairs = 0, 0.0, []
    for t in times:
        sides[turn].append(t)
        used += t
        if used >= slice_s or len(sides[turn]) >= tokens:  # a turn ends with its slice or its request
            turn, used = 1 - turn, 0.0
        if len(sides[0]) >= tokens and len(sides[1]) >= tokens:
            a, b = sides[0][:tokens], sides[1][:tokens]
            pairs.append(math.log(sum(a) / sum(b)))
            sides = [sides[0][tokens:], sides[1][tokens:]]
    return pairs


def spread(xs: list[float]) -> dict:
    """sd, robust sd (1.4826 MAD) and excess kurtosis of xs."""
    if len(xs) < 4:
        return {"n": len(xs)}
    med, sd, mean = statistics.median(xs), statistics.pstdev(xs), statistics.fmean(xs)
    kurt = statistics.fmean((x - mean) ** 4 for x in xs) / sd**4 - 3 if sd else 0.0
    return {
        "n": len(xs),
        "sd": sd,
        "robust_sd": 1.4826 * statistics.median(abs(x - med) for x in xs),
        "kurtosis": kurt,
    }


def per_second(trace: dict) -> dict[int, float]:
    """Mean log step time in each whole second of unix time the trace covers."""
    bins: dict[int, list[float]] = {}
    for s, t in zip(trace["starts"], trace["times"], strict=True):
        bins.setdefault(int(trace["unix_origin"] + s), []).append(math.log(t))
    return {k: statistics.fmean(v) for k, v in bins.items()}


def correlation(a: dict[int, float], b: dict[int, float]) -> float | None:
    """Pearson correlation over the seconds both traces cover (None with fewer than 10)."""
    keys = sorted(set(a) & set(b))
    if len(keys) < 10:
        return None
    return statistics.correlation([a[k] for k in keys], [b[k] for k in keys])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument(
        "--tokens", type=int, default=24, help="decode tokens a side a pair (the cpu profile: 24)"
    )
    ap.add_argument("--slices", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0, 1e9])
    ap.add_argument("--out")
    args = ap.parse_args()
    out: dict = {"traces": {}, "correlations": {}}
    loaded = {p: json.loads(Path(p).read_text()) for p in args.traces}
    print(
        "| trace | cpus | steps | median step | sd log step | slow steps | preempted | core slow | memory | "
        + " | ".join(f"pairs sd / robust @ {'whole' if s >= 1e8 else f'{s} s'}" for s in args.slices)
        + " |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|" + "--:|" * len(args.slices))
    for path, tr in loaded.items():
        slow = slow_steps(tr)
        sims = {str(s): spread(sliced_pairs(tr["times"], s, args.tokens)) for s in args.slices}
        out["traces"][path] = {"label": tr["args"].get("label"), "cpus": tr["cpus"], **slow, "pairs": sims}
        cells = " | ".join(
            f"{100 * v['sd']:.2f}% / {100 * v['robust_sd']:.2f}% (n {v['n']})" if "sd" in v else "-"
            for v in sims.values()
        )
        print(
            f"| {tr['args'].get('label') or Path(path).stem} | {tr['cpus']} | {slow['steps']} | "
            f"{slow['median_ms']:.1f} ms | {100 * slow['sd_log_step']:.2f}% | {slow['slow']} | "
            f"{slow['slow_preempted']} | {slow['slow_core']} | {slow['slow_memory']} | {cells} |"
        )
    names = list(loaded)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            r = correlation(per_second(loaded[a]), per_second(loaded[b]))
            if r is not None:
                out["correlations"][f"{a} ~ {b}"] = r
                print(f"correlation of one-second means, {Path(a).stem} ~ {Path(b).stem}: {r:+.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
