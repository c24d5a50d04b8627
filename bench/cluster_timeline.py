"""Where a call of the cluster decode kernel spends its time: per-CTA phase stamps over a graph of calls.

Each call of a CUDA graph (as the engine replays decode) writes, per CTA, the device's global timer and
SM clock at each phase of the kernel (`PHASES`). From them: the gap between one
call's last CTA leaving and the next call's first CTA starting, the spread of the CTAs' starts and
ends, and the median CTA's time in each phase. The stamps cost a few stores per CTA.

Usage (on the GPU box): python3 bench/cluster_timeline.py --ctx 4096 16384 32768 --plans auto 9 2x8
    --out timeline.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# what a CTA's stamps record (globaltimer ns in 0-7, clock64 in 8-15), in the kernel's order
PHASES = ("entry", "length read", "first tile", "own tiles done", "warps written", "CTA merged",
          "cluster merged", "exit")  # fmt: skip


def summarize(calls: list[list[list[int]]], phases: tuple[str, ...]) -> dict:
    """Per-call CTA stamps ([call][CTA][16]: 8 global-timer ns, 8 clock64) -> the timeline's numbers (µs).

    A phase a CTA never passed (stamp 0) is left out of that phase's median. The first call is only the
    reference for the second's gap.
    """
    n = len(phases)

    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    rows = []
    for i in range(1, len(calls)):
        prev_end = max(c[n - 1] for c in calls[i - 1])
        starts = [c[0] for c in calls[i]]
        ends = [c[n - 1] for c in calls[i]]
        phase_us = {}
        for j in range(1, n):
            # time from the last stamped phase before j to j, per CTA that stamped j
            spans = []
            for c in calls[i]:
                if c[j] == 0:
                    continue
                before = next((c[m] for m in range(j - 1, -1, -1) if c[m]), c[0])
                spans.append((c[j] - before) / 1e3)
            phase_us[phases[j]] = med(spans)
        streamed = [c[3] for c in calls[i] if c[3]]
        last = max(calls[i], key=lambda c: c[n - 1])
        rows.append({
            "period_us": (max(ends) - prev_end) / 1e3,
            # the CTAs' streams end unevenly (DRAM shared by all), and the last CTA out has its own epilogue
            "stream_end_spread_us": (max(streamed) - med([float(t) for t in streamed])) / 1e3 if streamed else 0.0,
            "last_epilogue_us": (last[n - 1] - (last[3] or last[0])) / 1e3,
            "gap_us": (min(starts) - prev_end) / 1e3,
            "start_spread_us": (max(starts) - min(starts)) / 1e3,
            "end_spread_us": (max(ends) - med([float(e) for e in ends])) / 1e3,
            "cta_us": med([(e - s) / 1e3 for s, e in zip(starts, ends, strict=True)]),
            "phase_us": phase_us,
        })  # fmt: skip
    if not rows:
        return {"calls": 0}
    keys = ("period_us", "gap_us", "start_spread_us", "end_spread_us", "stream_end_spread_us", "last_epilogue_us",
            "cta_us")  # fmt: skip
    out: dict = {"calls": len(rows)} | {k: med([r[k] for r in rows]) for k in keys}
    out["phase_us"] = {p: med([r["phase_us"][p] for r in rows]) for p in phases[1:]}
    # the SM clock over the CTAs' lifetimes (global timer ns against clock64 cycles)
    cycles = sum(c[8 + n - 1] - c[8] for call in calls for c in call)
    ns = sum(c[n - 1] - c[0] for call in calls for c in call)
    out["sm_clock_mhz"] = cycles / ns * 1e3 if ns else float("nan")
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", nargs="+", type=int, default=[4096, 16384, 32768])
    p.add_argument("--plans", nargs="+", default=["auto"], help="'auto', C (one cluster of C) or CxK")
    p.add_argument("--probe", action="store_true", help="also the stream-only probe of each plan")
    p.add_argument("--calls", type=int, default=36, help="calls in the graph")
    p.add_argument("--out")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import torch

    from kernels import cluster_decode as cd

    dev = torch.device("cuda")
    why = cd.unavailable_reason(dev)
    if why:
        sys.exit(f"cluster kernel unavailable: {why}")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    record: dict = {"schema": "bench.cluster_timeline/1", "device": torch.cuda.get_device_name(dev),
                    "shape": [args.hq, args.hkv, args.d], "batch": args.batch, "rows": []}  # fmt: skip
    for ctx in args.ctx:
        kv_bytes = 2 * args.batch * args.hkv * ctx * args.d * 2
        copies = max(2, -(-3 * l2 // kv_bytes))
        sets = [
            (
                torch.randn(args.batch, args.hq, args.d, device=dev, dtype=torch.bfloat16),
                torch.randn(args.batch, args.hkv, ctx, args.d, device=dev, dtype=torch.bfloat16),
                torch.randn(args.batch, args.hkv, ctx, args.d, device=dev, dtype=torch.bfloat16),
            )
            for _ in range(copies)
        ]
        n = torch.full((args.batch,), ctx, dtype=torch.int32, device=dev)
        base = cd.decode_config(sets[0][0], sets[0][1])
        for plan_text in args.plans:
            if plan_text == "auto":
                plan = (int(base["num_splits"]), int(base["num_clusters"]))
            else:
                c, _, k = plan_text.partition("x")
                plan = (int(c), int(k or 1))
            for probe in (0, 1) if args.probe else (0,):
                ctas = args.batch * args.hkv * plan[0] * plan[1]
                stamps = [torch.zeros(ctas * 16, dtype=torch.int64, device=dev) for _ in range(args.calls)]
                outs = [torch.empty_like(s[0]) for s in sets]

                def call(i: int, plan=plan, probe=probe, stamps=stamps, outs=outs, sets=sets, n=n) -> None:
                    q, k, v = sets[i % len(sets)]
                    cd.flash_decode(q, k, v, n, args.d**-0.5, out=outs[i % len(sets)], num_splits=plan[0],
                                    num_clusters=plan[1], probe=probe, stamps=stamps[i])  # fmt: skip

                for i in range(args.calls):  # warm, outside the capture
                    call(i)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for i in range(args.calls):
                        call(i)
                for _ in range(3):
                    graph.replay()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                torch.cuda.synchronize()
                per_call = start.elapsed_time(end) * 1e3 / args.calls
                calls = [s.view(ctas, 16).tolist() for s in stamps]
                row = {"ctx": ctx, "plan": f"{plan[0]}x{plan[1]}", "probe": probe, "ctas": ctas,
                       "graph_us_per_call": per_call} | summarize(calls, PHASES)  # fmt: skip
                record["rows"].append(row)
                print(json.dumps(row), file=sys.stderr)
    print(table(record["rows"]))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))


def table(rows: list[dict]) -> str:
    """The timeline as markdown: one row per (ctx, plan, probe)."""
    if not rows:
        return ""
    phases = list(rows[0].get("phase_us", {}))
    head = ["ctx", "plan", "probe", "CTAs", "graph µs/call", "period µs", "gap µs", "start spread", "end spread",
            "stream end spread", "last CTA's epilogue", "CTA µs", *phases]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        cells = [r["ctx"], r["plan"], r["probe"], r["ctas"]] + [
            f"{r.get(k, float('nan')):.2f}"
            for k in (
                "graph_us_per_call",
                "period_us",
                "gap_us",
                "start_spread_us",
                "end_spread_us",
                "stream_end_spread_us",
                "last_epilogue_us",
                "cta_us",
            )
        ]
        cells += [f"{r.get('phase_us', {}).get(p, float('nan')):.2f}" for p in phases]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
