"""Where the served A/B's noise comes from on this box, for an A/A run (the checkout's engine on both sides).

Runs the product's own measurement (`evalbot.evaluate.abtest.measure`: sandboxed warm serving processes
in crossover blocks, requests interleaved, the idle side frozen, every request clocked by wall time and by
the CPU time of the engine's process tree) for a fixed number of blocks, then splits the variance of the
per-pair log-ratios into its sources:

- wall against CPU time: what steal and preemption add to the wall clock (CPU time does not see them);
- within a block (pair to pair) against between blocks (fresh processes: memory placement, allocator,
  page cache), with the load-order effect the crossover removes, and the pair-order effect;
- steal ticks and involuntary context switches per request (other tenants), and their correlation with
  the pair residuals; the utilization (CPU seconds per wall second) per side;
- the first pair of a block against the rest (warm-up left over).

    python bench/variance_breakdown.py --blocks 8 --pairs 2 --contexts 128 512 --out breakdown.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalbot.evaluate import ab_samples, abtest, box, cpumeter, sandbox, served  # noqa: E402
from evalbot.model import Side  # noqa: E402
from evalbot.rules import default_rules_dir, load_rules  # noqa: E402


def _log_ratio(samples: list[ab_samples.Sample], metric: str) -> dict[tuple[int, int, int], float]:
    """(context, block, pair) -> ln(head / base) for a metric."""
    by: dict[tuple[int, int, int], dict[Side, ab_samples.Sample]] = {}
    for s in samples:
        by.setdefault((s.context, s.block, s.pair), {})[s.side] = s
    out = {}
    for key, sides in by.items():
        if len(sides) == 2:
            b, h = ab_samples._value(sides[Side.BASE], metric), ab_samples._value(sides[Side.HEAD], metric)
            if b and h:
                out[key] = math.log(h / b)
    return out


def _components(d: dict[tuple[int, int, int], float], base_first: dict[int, bool]) -> dict[str, float]:
    """Within-block sd, between-block sd (process offsets, after the load order), the load-order effect."""
    blocks: dict[int, list[float]] = {}
    for (_, b, _), x in d.items():
        blocks.setdefault(b, []).append(x)
    within = [x - statistics.fmean(v) for v in blocks.values() for x in v]
    dof = sum(len(v) - 1 for v in blocks.values())
    sw2 = sum(x * x for x in within) / dof if dof else float("nan")
    means = {b: statistics.fmean(v) for b, v in blocks.items()}
    first = [m for b, m in means.items() if base_first[b]]
    second = [m for b, m in means.items() if not base_first[b]]
    gamma = (statistics.fmean(first) - statistics.fmean(second)) / 2 if first and second else float("nan")
    resid = [m - statistics.fmean(first) for m in first] + [m - statistics.fmean(second) for m in second]
    sb2_total = sum(r * r for r in resid) / max(1, len(resid) - 2)
    n_per = statistics.fmean(len(v) for v in blocks.values())
    sb2 = max(0.0, sb2_total - sw2 / n_per)
    return {
        "pairs": len(d),
        "blocks": len(blocks),
        "within_sd": math.sqrt(sw2),
        "between_sd": math.sqrt(sb2),
        "block_mean_sd": math.sqrt(sb2_total),
        "load_order_effect": gamma,
        "mean": statistics.fmean(d.values()),
    }


def breakdown(samples: list[ab_samples.Sample]) -> dict:
    """The variance split per context (see the module docstring)."""
    base_first = {s.block: s.base_first for s in samples}
    out: dict = {"contexts": {}}
    for ctx in sorted({s.context for s in samples}):
        at = [s for s in samples if s.context == ctx]
        row: dict = {}
        for metric in ("decode", "decode_cpu", "utilization"):
            d = {k: v for k, v in _log_ratio(at, metric).items()}
            if len(d) >= 4:
                row[metric] = _components(d, base_first)
        # pair order: ln(first timed / second timed), whichever side it was
        by: dict[tuple[int, int], list[ab_samples.Sample]] = {}
        for s in at:
            by.setdefault((s.block, s.pair), []).append(s)
        order = [
            math.log(
                next(x for x in v if x.went_first).decode_tps
                / next(x for x in v if not x.went_first).decode_tps
            )
            for v in by.values()
            if len(v) == 2
        ]
        row["pair_order_effect"] = statistics.fmean(order) if order else None
        wall = _log_ratio(at, "decode")
        first_pair = [x for (c, b, p), x in wall.items() if p == 0]
        rest = [x for (c, b, p), x in wall.items() if p > 0]
        row["first_pair_minus_rest"] = (
            (statistics.fmean(first_pair) - statistics.fmean(rest)) if first_pair and rest else None
        )
        steal = [s.steal_ticks for s in at]
        invol = [s.switches[1] for s in at]
        row["steal_ticks_per_request"] = statistics.fmean(steal)
        row["involuntary_switches_per_request"] = statistics.fmean(invol)
        row["utilization_by_side"] = {
            side.value: statistics.fmean(
                s.decode_cpu_s / s.decode_s for s in at if s.side is side and s.decode_cpu_s
            )
            for side in (Side.BASE, Side.HEAD)
        }
        # do the noisy pairs coincide with steal or preemption? |wall residual - CPU residual| vs steal
        cpu = _log_ratio(at, "decode_cpu")
        gap = [
            (
                abs(wall[k] - cpu[k]),
                sum(s.steal_ticks + s.switches[1] for s in at if (s.block, s.pair) == k[1:]),
            )
            for k in wall
            if k in cpu
        ]
        if len(gap) >= 4 and len({g for g, _ in gap}) > 1 and len({x for _, x in gap}) > 1:
            row["wall_cpu_gap_vs_interference_corr"] = statistics.correlation(*zip(*gap, strict=True))
        out["contexts"][ctx] = row
    return out


def table(result: dict) -> str:
    """The breakdown as a markdown table (per context and clock; sds and effects in % of the ratio)."""
    lines = [
        "| ctx | clock | pairs | blocks | within-block sd | between-block sd | load-order effect | mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ctx, row in result["contexts"].items():
        for metric in ("decode", "decode_cpu", "utilization"):
            c = row.get(metric)
            if c:
                lines.append(
                    f"| {ctx} | {metric} | {c['pairs']} | {c['blocks']} | {100 * c['within_sd']:.2f}% | "
                    f"{100 * c['between_sd']:.2f}% | {100 * c['load_order_effect']:+.2f}% | "
                    f"{100 * c['mean']:+.2f}% |"
                )
    lines.append("")
    lines.append(
        "| ctx | pair-order effect | first pair minus rest | steal ticks/request | involuntary switches/request "
        "| utilization main / PR | corr(wall-CPU gap, interference) |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for ctx, row in result["contexts"].items():
        po, fp = row["pair_order_effect"], row["first_pair_minus_rest"]
        u = row["utilization_by_side"]
        corr = row.get("wall_cpu_gap_vs_interference_corr")
        lines.append(
            f"| {ctx} | {'-' if po is None else f'{100 * po:+.2f}%'} | {'-' if fp is None else f'{100 * fp:+.2f}%'} "
            f"| {row['steal_ticks_per_request']:.2f} | {row['involuntary_switches_per_request']:.1f} "
            f"| {u['base']:.3f} / {u['head']:.3f} | {'-' if corr is None else f'{corr:+.2f}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=2, help="pairs per context per block (even)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of each engine (0: every core)")
    ap.add_argument("--no-sandbox", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    from evalbot.reference.registry import resolve

    model = resolve(args.model)
    rules = load_rules(default_rules_dir())
    cpu = rules.profile("cpu")
    m = dataclasses.replace(
        cpu.measurement,
        decode_tokens=args.tokens,
        pairs_per_block=args.pairs,
        min_blocks=args.blocks,
        max_pairs=args.blocks * args.pairs,
        ci_half_width=1e-9,
        time_budget_s=10**6,
    )
    contexts = tuple(dataclasses.replace(cpu.contexts[0], ctx=c) for c in args.contexts)
    profile = dataclasses.replace(cpu, contexts=contexts, measurement=m)
    work = Path(tempfile.mkdtemp(prefix="evalbot-breakdown-"))
    meters = []

    def launch(side: Side) -> served.ServedProcess:
        scratch = work / f"{side.value}-{time.monotonic_ns()}"
        scratch.mkdir()
        env = sandbox.scrub_env(os.environ) | {
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": str(args.threads or os.cpu_count() or 1),
            "PYTHONHASHSEED": "0",
        }
        spec = sandbox.SandboxSpec(
            ro_binds=tuple(dict.fromkeys([*sandbox.system_ro_binds(), ROOT, Path(sys.prefix), model.parent])),
            scratch=scratch,
            workdir=ROOT,
            env=env,
            limits=sandbox.Limits(timeout_s=3600, memory_bytes=48 << 30),
        )
        argv = [
            sys.executable,
            "-m",
            "engine",
            "serve",
            "--model",
            str(model),
            "--max-seq",
            str(max(args.contexts) + args.tokens + 16),
            "--warmup",
            "1",
        ]
        meter = cpumeter.make_meter(side.value)
        meters.append(meter)
        return served.ServedProcess.start(side.value, spec, argv, no_sandbox=args.no_sandbox, meter=meter)

    procs: dict[Side, served.ServedProcess] = {}

    def tracked(side: Side) -> served.ServedProcess:
        procs[side] = launch(side)
        return procs[side]

    pool = ab_samples.Prompts(lambda c, i: abtest.random_prompts(procs[Side.BASE].vocab, 7)(c, i))
    t0 = time.monotonic()
    run, last = abtest.measure(profile, tracked, pool, lambda msg: print(msg, file=sys.stderr))
    for p in last.values():
        p.close()
    result = {
        "date": box.now(),
        "box": box.identity(),
        "threads": args.threads or os.cpu_count(),
        "meter": cpumeter.describe(meters[0]) if meters else None,
        "blocks": run.blocks,
        "wall_s": round(time.monotonic() - t0, 1),
        **breakdown(run.samples),
        "samples": [
            dataclasses.asdict(s) | {"prompt": len(s.prompt), "tokens": len(s.tokens)} for s in run.samples
        ],
    }
    if args.out:  # before the table: a run is minutes of measurement
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
