"""Flash-decode against the device's copy bandwidth and torch SDPA, on the same GPU in the same run.

For each shape, context and batch (bf16, every sequence at full length) it times our split-KV kernel
and ``scaled_dot_product_attention(enable_gqa=True)`` two ways: ``triton.testing.do_bench`` (L2
flushed before each call, launches on a stream) and replays of a CUDA graph that walks over enough
input copies to defeat the L2. Achieved bandwidth is bytes of K and V read over time, given as a
share of a device-to-device copy measured here (bytes read + written over time). At batch 1 the
stream numbers are bound by Python launch cost (also reported, as host µs per call), so the graph
numbers are the kernels'. Every config is checked once against the PyTorch reference. Prints a
markdown table; ``--out`` writes JSON. ``--splits/--block-n/--warps/--stages/--pdl/
--combine-block-d`` take lists and time every combination (graph only), for tuning; ``--profile``
adds per-kernel device times.

    python bench/flash_decode.py --batch 1 8 --out flash_decode.json
    python bench/flash_decode.py --interpret   # one tiny config on the CPU, to check the script
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

TILE_KEYS = (
    "num_splits",
    "block_n",
    "num_warps",
    "num_stages",
    "pdl",
    "combine_block_d",
    "pdl_wait",
    "combine_warps",
)
SHAPES = {
    "q32-kv8-d128": (32, 8, 128),  # qwen3-8b's attention (GQA ratio 4)
    "q64-kv8-d128": (64, 8, 128),  # GQA ratio 8 at d128 (the issue's "GQA-8 hd128"; Qwen2.5-72B's heads)
    "q24-kv4-d256": (24, 4, 256),  # GQA ratio 6 at d256 (the issue's "GQA-6 hd256")
    "q16-kv8-d64": (16, 8, 64),
}
# the issue's shapes and qwen3-8b's; d64 only for tuning
DEFAULT_SHAPES = ["q32-kv8-d128", "q64-kv8-d128", "q24-kv4-d256"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    p.add_argument("--ctx", nargs="+", type=int, default=[4096, 16384, 32768])
    p.add_argument("--batch", nargs="+", type=int, default=[1])
    p.add_argument("--splits", nargs="+", default=["auto"], help="'auto' (the heuristic) and/or ints")
    p.add_argument("--block-n", nargs="+", type=int, default=[0], help="0 = the default tile")
    p.add_argument("--warps", nargs="+", type=int, default=[0], help="0 = the default tile")
    p.add_argument("--stages", nargs="+", type=int, default=[0], help="0 = the default tile")
    p.add_argument("--combine-block-d", nargs="+", type=int, default=[0], help="0 = the default")
    p.add_argument("--combine-warps", nargs="+", type=int, default=[0], help="0 = the default")
    p.add_argument(
        "--pdl", nargs="+", default=["auto"], help="'auto', 0 and/or 1: programmatic dependent launch"
    )
    p.add_argument(
        "--pdl-wait", nargs="+", default=["auto"], help="'auto', 0 and/or 1: launch the partial kernel early"
    )
    p.add_argument(
        "--valid",
        type=int,
        default=0,
        help="valid positions per sequence (0: all of ctx); cache stays ctx long",
    )
    p.add_argument(
        "--timeline",
        action="store_true",
        help="per-program global-timer trace of every variant (start, first loads, end; combine wait)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also time the fixed cost of a call: one tile of context, empty kernels",
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also time, per problem, a copy of its bytes and a compute-free Triton read of its K and V",
    )
    p.add_argument("--no-cluster", action="store_true", help="leave out the CUDA cluster kernel")
    p.add_argument(
        "--cluster-splits",
        nargs="+",
        default=["auto"],
        help="cluster kernel: 'auto' and/or CTAs a cluster (C: one cluster a head) or CxK (K clusters of C)",
    )
    p.add_argument(
        "--cluster-configs",
        choices=["default", "all"],
        default="default",
        help="cluster kernel: its default (stages, groups) or every instantiated one",
    )
    p.add_argument(
        "--cluster-probe",
        action="store_true",
        help="cluster kernel: also time its stream-only probe (tiles loaded, no attention)",
    )
    p.add_argument("--cluster-pdl", nargs="+", default=["auto"], help="cluster kernel: 'auto', 0 and/or 1")
    p.add_argument(
        "--cluster-layouts", nargs="+", default=["auto"], help="cluster kernel: 'auto', 0 and/or 1"
    )
    p.add_argument(
        "--cluster-l2", nargs="+", default=["auto"], help="cluster kernel: 'auto' and/or 0-3 (L2 promotion)"
    )
    p.add_argument("--cluster-orders", nargs="+", default=["auto"], help="cluster kernel: 'auto', 0 and/or 1")
    p.add_argument("--ops-choice", action="store_true", help="also record engine.ops' measured kernel choice")
    p.add_argument("--profile", action="store_true", help="per-kernel device times (torch.profiler)")
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time per measurement")
    p.add_argument("--interpret", action="store_true", help="one tiny config on the CPU (Triton interpreter)")
    p.add_argument("--out", help="write the JSON record here")
    return p.parse_args()


def copy_bandwidth(torch, do_bench) -> float:
    """Read+write bandwidth of a 1 GiB device-to-device copy, bytes/s."""
    src = torch.randn(2**29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


# Calls per captured graph: the input copies are cycled until a graph holds at least this many, as
# many as a qwen3-8b decode step's graph holds attention calls (36 layers), so each replay's own
# launch is spread over as many calls as in the engine rather than over the 2-11 input copies.
GRAPH_CALLS = 36


def graph_time_us(
    torch, calls: list, replays: int = 20, rounds: int = 7, min_calls: int = GRAPH_CALLS
) -> float:
    """Median time of one call when the calls (one per input copy, cycled) are replayed in a CUDA graph."""
    calls = calls * math.ceil(min_calls / len(calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compilation, workspace) outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * len(calls)))
    return statistics.median(times)


def time_ours(
    torch, fd, do_bench, sets, lengths, scale, tile, ref, cuda, rep_ms, stream, timeline=False
) -> dict:
    """Check one launch config against the reference, then time it (graph; and stream when asked)."""
    q = sets[0][0]
    b, hq, d = q.shape
    ws = fd.FlashDecodeWorkspace.allocate(b, hq, d, tile["num_splits"], q.device)
    outs = [torch.full_like(s[0], float("nan")) for s in sets]

    def run(q, k, v, out):
        return fd.flash_decode(q, k, v, lengths, scale, out=out, workspace=ws, **tile)

    run(*sets[0], outs[0])
    row = {"max_abs_err": (outs[0].float() - ref).abs().max().item()}
    if not cuda:
        t0 = time.perf_counter()
        run(*sets[0], outs[0])
        return row | {"stream_us": (time.perf_counter() - t0) * 1e6}
    cfg = fd.decode_config(*sets[0], lengths, workspace=ws, **tile)
    launched = fd._launch(*sets[0], lengths, scale, outs[0], ws, cfg)
    row["resources"] = {  # registers, spills and shared memory the compiler gave each kernel
        name: {key: getattr(kernel, key, None) for key in ("n_regs", "n_spills")}
        | {"shared": getattr(getattr(kernel, "metadata", None), "shared", None)}
        for name, kernel in zip(("partial", "combine"), launched, strict=True)
        if kernel is not None
    }
    calls = [lambda s=s, o=o: run(*s, o) for s, o in zip(sets, outs, strict=True)]
    row["graph_us"] = graph_time_us(torch, calls)
    if stream:  # the default config: also as earlier records measured it, one graph per pass over the copies
        row["graph_one_pass_us"] = graph_time_us(torch, calls, min_calls=1)
    row["partial_only_graph_us"] = graph_time_us(  # the partial kernel alone: what the combine adds
        torch,
        [
            lambda s=s, o=o: fd._launch_partial(*s, lengths, scale, o, ws, cfg)
            for s, o in zip(sets, outs, strict=True)
        ],
    )
    if timeline:
        row["timeline"] = trace_timeline(torch, fd, sets, outs, lengths, scale, ws, cfg)
    if stream:
        row["stream_us"] = do_bench(calls[0], warmup=25, rep=rep_ms, return_mode="median") * 1e3
        row["host_us"] = host_time_us(torch, calls[0])
        row["host_launch_only_us"] = host_time_us(  # the two Triton launches without our argument handling
            torch, lambda: fd._launch(*sets[0], lengths, scale, outs[0], ws, cfg)
        )
    return row


def trace_timeline(torch, fd, sets, outs, lengths, scale, ws, cfg) -> dict:
    """Global-timer trace of the last two calls of a graph replay over the input copies.

    Every program of both kernels writes its start, its end and its SM; a partial program also when its
    PDL wait returned, when its length arrived and when its loop began, a combine program when its PDL
    wait returned and when its loads arrived (``kernels.flash_decode.TRACE_FIELDS``). Times are µs from the first partial program's start of the
    traced call; ``gap_from_previous_call_us`` is that start minus the previous call's last combine end.
    """
    b, hq, d = sets[0][0].shape
    hkv = sets[0][1].shape[1]
    rows = cfg["num_splits"] * b * hkv + (
        b * hq * (d // cfg["combine_block_d"]) if cfg["num_splits"] > 1 else 0
    )
    fields = fd.TRACE_FIELDS.value
    traces = [torch.zeros(rows, fields, dtype=torch.int64, device=sets[0][0].device) for _ in range(2)]
    order = list(range(len(sets))) if len(sets) >= 2 else [0, 0]  # the last two calls are traced
    tags = [None] * (len(order) - 2) + traces
    calls = [
        functools.partial(fd._launch, *sets[i], lengths, scale, outs[i], ws, cfg, trace=tr)
        for i, tr in zip(order, tags, strict=True)
    ]
    graph_time_us(torch, calls, replays=5, rounds=3)
    prev, cur = (t.cpu() for t in traces)
    np_ = cfg["num_splits"] * b * hkv
    t0 = int(cur[:np_, 0].min())

    def q(x, p: float) -> float:
        x = sorted(x)
        return (x[min(len(x) - 1, round(p * (len(x) - 1)))] - t0) / 1e3

    part, comb = cur[:np_].tolist(), cur[np_:].tolist()
    out = {
        "partial_start_us": {p: q([r[0] for r in part], p) for p in (0.5, 1.0)},
        "partial_waited_us": {p: q([r[4] for r in part], p) for p in (0.0, 0.5, 1.0)},
        "partial_length_us": {p: q([r[5] for r in part], p) for p in (0.0, 0.5, 1.0)},
        "partial_loop_us": {p: q([r[1] for r in part], p) for p in (0.0, 0.5, 1.0)},
        "partial_end_us": {p: q([r[2] for r in part], p) for p in (0.0, 0.1, 0.5, 0.9, 1.0)},
        "partial_sms": len({r[3] for r in part}),
        # per partial program (row = (sequence * Hkv + head) * splits + split): loop start, end (µs), SM
        "partial_programs": [[round((r[1] - t0) / 1e3, 3), round((r[2] - t0) / 1e3, 3), r[3]] for r in part],
    }
    if comb:
        out |= {
            "combine_start_us": {p: q([r[0] for r in comb], p) for p in (0.0, 0.5, 1.0)},
            "combine_waited_us": {p: q([r[1] for r in comb], p) for p in (0.0, 0.5, 1.0)},
            "combine_loaded_us": {p: q([r[4] for r in comb], p) for p in (0.0, 0.5, 1.0)},
            "combine_end_us": {p: q([r[2] for r in comb], p) for p in (0.5, 1.0)},
        }
        out["gap_from_previous_call_us"] = (t0 - int(prev[np_:, 2].max())) / 1e3
    else:
        out["gap_from_previous_call_us"] = (t0 - int(prev[:np_, 2].max())) / 1e3
    return out


def host_time_us(torch, call, n: int = 300) -> float:
    """CPU time to issue one call (the GPU runs behind; the launch queue never fills at this n)."""
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def kernel_times_us(torch, calls: list, rounds: int = 10) -> dict[str, float]:
    """Mean device time per call of each kernel the calls launch (torch.profiler, stream launches)."""
    from torch.profiler import ProfilerActivity, profile

    for call in calls:
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            for call in calls:
                call()
        torch.cuda.synchronize()
    n = rounds * len(calls)
    return {
        e.key[:60]: e.device_time_total / n
        for e in prof.key_averages()
        if e.device_time_total > 0 and e.count >= n
    }


def floor_us(torch, triton, fd, device) -> dict[str, float]:
    """Graph-replayed µs of calls whose data is negligible: what every call pays before reading any KV."""

    @triton.jit
    def _empty(x):
        pass

    out: dict[str, float] = {}
    dummy = torch.zeros(1, device=device)
    out["empty_triton_kernel"] = graph_time_us(torch, [lambda: _empty[(132,)](dummy)] * 8)
    out["two_empty_triton_kernels"] = 2 * out["empty_triton_kernel"]
    for name, (hq, hkv, d) in SHAPES.items():
        q = torch.randn(1, hq, d, device=device, dtype=torch.bfloat16)
        k = torch.randn(1, hkv, 16 * 64, d, device=device, dtype=torch.bfloat16)
        lengths = torch.full((1,), 16 * 64, dtype=torch.int32, device=device)
        for splits in (1, 16):
            ws = fd.FlashDecodeWorkspace.allocate(1, hq, d, splits, device)
            o = torch.empty_like(q)
            call = functools.partial(
                fd.flash_decode, q, k, k, lengths, 0.1, out=o, workspace=ws, num_splits=splits,
                block_n=64,
            )  # fmt: skip
            out[f"{name} ctx1024 splits{splits}"] = graph_time_us(torch, [call] * 8)
    return out


def ceiling_us(torch, triton, sets, kv_bytes: int, num_sms: int) -> dict[str, float]:
    """What moving this problem's bytes costs per call with no attention at all (graph-replayed, same input copies).

    ``copy`` copies a buffer the size of K plus V (its bytes moved are read + write); ``read P`` is a
    Triton kernel that only streams K and V (sums them, so the loads stay) with P programs of equal
    contiguous ranges, pipelined like the attention kernel. No attention kernel that reads the K and V
    once per call can beat these, so they bound the share of copy bandwidth reachable at this size.
    """
    from stream_read import stream_read

    out: dict[str, float] = {}
    n_copy = max(1, len(sets))
    src = [torch.empty(kv_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_() for _ in range(n_copy)]
    dst = [torch.empty_like(x) for x in src]
    out["copy_us"] = graph_time_us(
        torch, [lambda a=a, b=b: b.copy_(a) for a, b in zip(src, dst, strict=True)]
    )
    del src, dst
    numel = sets[0][1].numel()
    block = 8192  # 16 KiB of bf16 per load, K and V each: the attention kernel's 64 x 128 tile
    for programs in (128, num_sms, 2 * num_sms, 4 * num_sms):
        per_prog = math.ceil(math.ceil(numel / programs) / block) * block
        res = torch.empty(programs, dtype=torch.float32, device="cuda")
        for warps, stages in ((4, 4), (8, 3)):
            launch = functools.partial(
                stream_read[(programs,)], BLOCK=block, num_warps=warps, num_stages=stages
            )
            calls = [functools.partial(launch, k, v, res, numel, per_prog) for _, k, v in sets]
            out[f"read_{programs}p_{warps}w_{stages}s_us"] = graph_time_us(torch, calls)
    return out


def _cluster_plan(text: str) -> tuple[int, int]:
    """'9' -> (9, 1): one cluster of 9 a head; '2x8' -> (2, 8): 8 clusters of 2."""
    c, _, k = text.partition("x")
    return int(c), int(k or 1)


def time_cluster(torch, cd, sets, lengths, scale, ref, args) -> dict:
    """The CUDA cluster kernel: its default and every asked variant, each checked then graph-replayed."""
    q, k, _ = sets[0]
    base = cd.decode_config(q, k)
    configs = cd.CONFIGS[q.shape[-1]] if args.cluster_configs == "all" else [(base["stages"], base["groups"])]
    variants = []
    for splits, (stages, groups), pdl, layout, l2, order in itertools.product(
        args.cluster_splits,
        configs,
        args.cluster_pdl,
        args.cluster_layouts,
        args.cluster_l2,
        args.cluster_orders,
    ):
        c_k = (base["num_splits"], base["num_clusters"]) if splits == "auto" else _cluster_plan(splits)
        tile = {
            "num_splits": c_k[0],
            "num_clusters": c_k[1],
            "stages": stages,
            "groups": groups,
            "pdl": base["pdl"] if pdl == "auto" else bool(int(pdl)),
            "layout": base["layout"] if layout == "auto" else int(layout),
            "l2_promotion": base["l2_promotion"] if l2 == "auto" else int(l2),
            "order": base["order"] if order == "auto" else int(order),
        }
        if tile not in variants:
            variants.append(tile)
    keys = ("num_splits", "num_clusters", "stages", "groups", "pdl", "layout", "l2_promotion", "order")
    default = {key: base[key] for key in keys}
    if default not in variants:
        variants.insert(0, default)
    if args.cluster_probe:
        variants.append(default | {"probe": 1})
    rows = []
    for tile in variants:
        row = {"config": {**base, **tile}, "default": tile == default}
        try:
            outs = [torch.full_like(x[0], float("nan")) for x in sets]
            cd.flash_decode(*sets[0], lengths, scale, out=outs[0], **tile)
            err = (outs[0].float() - ref).abs()
            row["max_abs_err"] = err.max().item() if not outs[0].isnan().any() else float("nan")
            row["rel_err"] = ((outs[0].float() - ref).norm() / ref.norm()).item()  # NaN for the probe
            calls = [
                lambda x=x, o=o, t=tile: cd.flash_decode(*x, lengths, scale, out=o, **t)
                for x, o in zip(sets, outs, strict=True)
            ]
            row["graph_us"] = graph_time_us(torch, calls)
            if tile == default:
                row["graph_us_again"] = graph_time_us(torch, calls)  # the spread of one version, timed twice
        except Exception as exc:  # a variant may not launch (cluster too large for the device): record it
            if tile == default:
                raise
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        print(
            f"  cluster {tile}: {row.get('graph_us', row.get('error'))} us, err {row.get('max_abs_err')}",
            file=sys.stderr,
        )
    fits = cd.max_active_clusters(q.device, q.dtype, q.shape[-1], base["stages"], base["groups"])
    return {"cluster": rows[0] if rows[0]["default"] else next(r for r in rows if r["default"]),
            "cluster_variants": rows, "cluster_max_active": fits}  # fmt: skip


def time_sdpa(torch, F, do_bench, sets, scale, ref, cuda, rep_ms) -> dict:
    """The same problem through torch SDPA with enable_gqa (q as a length-1 query sequence)."""

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)

    row = {"sdpa_max_abs_err": (sdpa(*sets[0])[:, :, 0].float() - ref).abs().max().item()}
    if not cuda:
        t0 = time.perf_counter()
        sdpa(*sets[0])
        return row | {"sdpa_stream_us": (time.perf_counter() - t0) * 1e6}
    row["sdpa_stream_us"] = (
        do_bench(lambda: sdpa(*sets[0]), warmup=25, rep=rep_ms, return_mode="median") * 1e3
    )
    row["sdpa_host_us"] = host_time_us(torch, lambda: sdpa(*sets[0]))
    row["sdpa_graph_us"] = graph_time_us(torch, [lambda s=s: sdpa(*s) for s in sets])
    row["sdpa_graph_one_pass_us"] = graph_time_us(torch, [lambda s=s: sdpa(*s) for s in sets], min_calls=1)
    return row


def main() -> None:
    args = parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch
    import torch.nn.functional as F
    import triton
    from triton.testing import do_bench

    from kernels import cluster_decode as cd
    from kernels import flash_decode as fd
    from kernels.reference import decode_attention

    cuda = torch.cuda.is_available() and not args.interpret
    if not cuda and not args.interpret:
        raise SystemExit("needs a CUDA device (or --interpret for a CPU smoke run)")
    device = torch.device("cuda" if cuda else "cpu")
    if args.interpret:
        configs = [("q8-kv2-d64", (8, 2, 64), 520, 2)]
    else:
        configs = [(s, SHAPES[s], c, b) for s in args.shapes for c in args.ctx for b in args.batch]
    shortest = min(ctx for _, _, ctx, _ in configs)
    if not 0 <= args.valid <= shortest:
        raise SystemExit(
            f"--valid {args.valid} must be 0 (all of ctx) or 1..{shortest} (the shortest context run)"
        )

    record = {
        "schema": "bench.flash_decode/1",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu (interpreter) {platform.processor()}",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "dtype": "bfloat16",
        "rows": [],
    }
    cluster_off = args.no_cluster or not cuda or cd.unavailable_reason(device)
    if not args.no_cluster:
        record["cluster_kernel"] = (
            "available" if not cluster_off else (cd.unavailable_reason(device) or "no CUDA")
        )
        print(f"cluster kernel: {record['cluster_kernel']}", file=sys.stderr)
    if cuda:
        record["num_sms"] = fd.sm_count(device)
        record["l2_bytes"] = torch.cuda.get_device_properties(device).L2_cache_size
        record["copy_bytes_per_s"] = copy_bandwidth(torch, do_bench)
        print(
            f"{record['device']}: copy {record['copy_bytes_per_s'] / 1e12:.2f} TB/s (read+write)",
            file=sys.stderr,
        )

    gen = torch.Generator(device=device).manual_seed(0)
    for name, (hq, hkv, d), ctx, batch in configs:
        dtype = torch.bfloat16
        scale = d**-0.5
        kv_bytes = 2 * batch * hkv * ctx * d * 2
        # enough input copies that a graph walking over them never finds its K/V in the L2
        n_sets = max(1, math.ceil(3 * record.get("l2_bytes", 0) / kv_bytes)) if cuda else 1
        sets = []
        for _ in range(n_sets):
            q = torch.randn(batch, hq, d, generator=gen, device=device, dtype=dtype)
            k = torch.randn(batch, hkv, ctx, d, generator=gen, device=device, dtype=dtype)
            v = torch.randn(batch, hkv, ctx, d, generator=gen, device=device, dtype=dtype)
            sets.append((q, k, v))
        lengths = torch.full((batch,), args.valid or ctx, dtype=torch.int32, device=device)
        q, k, v = sets[0]
        reasons = fd.unsupported_reasons(q, k, v, lengths)
        if reasons:
            raise SystemExit(f"{name}: unsupported: {reasons}")
        ref = decode_attention(q.float(), k.float(), v.float(), lengths, scale)
        base = fd.decode_config(q, k, v, lengths)

        variants = []
        for splits, block_n, warps, stages, pdl, cbd, pdl_wait, cwarps in itertools.product(
            args.splits,
            args.block_n,
            args.warps,
            args.stages,
            args.pdl,
            args.combine_block_d,
            args.pdl_wait,
            args.combine_warps,
        ):
            tile = {
                "num_splits": base["num_splits"] if splits == "auto" else int(splits),
                "block_n": block_n or base["block_n"],
                "num_warps": warps or base["num_warps"],
                "num_stages": stages or base["num_stages"],
                "pdl": base["pdl"] if pdl == "auto" else bool(int(pdl)),
                "combine_block_d": cbd or base["combine_block_d"],
                "pdl_wait": base["pdl_wait"] if pdl_wait == "auto" else bool(int(pdl_wait)),
                "combine_warps": cwarps or base["combine_warps"],
            }
            if tile not in variants:
                variants.append(tile)
        default = {key: base[key] for key in TILE_KEYS}
        if default not in variants:
            variants.insert(0, default)

        for tile in variants:
            row = {"shape": name, "hq": hq, "hkv": hkv, "d": d, "ctx": ctx, "batch": batch, "kv_bytes": kv_bytes,
                   "config": {**base, **tile}, "default": tile == default}  # fmt: skip
            try:
                row |= time_ours(
                    torch,
                    fd,
                    do_bench,
                    sets,
                    lengths,
                    scale,
                    tile,
                    ref,
                    cuda,
                    args.rep_ms,
                    tile == default,
                    timeline=args.timeline and cuda,
                )
            except Exception as exc:  # a tuning variant may not fit (shared memory): record it, go on
                if tile == default:
                    raise
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            if tile == default:
                row |= time_sdpa(torch, F, do_bench, sets, scale, ref, cuda, args.rep_ms)
                if not cluster_off:
                    row |= time_cluster(torch, cd, sets, lengths, scale, ref, args)
                    c = row["cluster"]
                    c["graph_pct_copy"] = 100 * kv_bytes / (c["graph_us"] * 1e-6) / record["copy_bytes_per_s"]
                if args.ops_choice and cuda:
                    from engine import ops

                    choice = ops.choose_decode_kernel(q, k, v, lengths, scale, by_timing=True)
                    row["ops_choice"] = choice.record()
            if args.ceiling and cuda and tile == default:
                row["ceiling"] = ceiling_us(torch, triton, sets, kv_bytes, record["num_sms"])
                best_read = min(v for k, v in row["ceiling"].items() if k.startswith("read"))
                pct = 100 * kv_bytes * 1e6 / record["copy_bytes_per_s"]  # over µs: % of copy bandwidth
                row["ceiling_pct_copy"] = {
                    "copy": 2 * pct / row["ceiling"]["copy_us"],
                    "best_read": pct / best_read,
                }
                print(f"  ceiling: {row['ceiling']} -> % of copy {row['ceiling_pct_copy']}", file=sys.stderr)
            if args.profile and cuda and tile == default:
                ws = fd.FlashDecodeWorkspace.allocate(batch, hq, d, tile["num_splits"], device)
                kw = dict(tile, workspace=ws)
                row["kernel_us"] = kernel_times_us(
                    torch,
                    [lambda s=s, kw=kw, n=lengths, c=scale: fd.flash_decode(*s, n, c, **kw) for s in sets],
                )
                if tile == default:
                    row["sdpa_kernel_us"] = kernel_times_us(
                        torch,
                        [
                            lambda s=s: F.scaled_dot_product_attention(
                                s[0][:, :, None], s[1], s[2], enable_gqa=True
                            )
                            for s in sets
                        ],
                    )
                print(f"  kernels: {row['kernel_us']} sdpa: {row.get('sdpa_kernel_us')}", file=sys.stderr)
            for key in (
                "stream_us",
                "graph_us",
                "graph_one_pass_us",
                "sdpa_stream_us",
                "sdpa_graph_us",
                "sdpa_graph_one_pass_us",
            ):
                if key in row:
                    row[key.replace("_us", "_gbps")] = kv_bytes / (row[key] * 1e-6) / 1e9
                    if cuda:
                        row[key.replace("_us", "_pct_copy")] = (
                            100 * kv_bytes / (row[key] * 1e-6) / record["copy_bytes_per_s"]
                        )
            record["rows"].append(row)
            summary = row.get("error") or (
                f"graph {row.get('graph_us', float('nan')):.1f} us, err {row['max_abs_err']:.2e}, "
                f"host us/call {row.get('host_us', float('nan')):.1f} (launches {row.get('host_launch_only_us', float('nan')):.1f},"
                f" sdpa {row.get('sdpa_host_us', float('nan')):.1f}), {row.get('resources')}"
            )
            print(f"{name} ctx={ctx} B={batch} {tile}: {summary}", file=sys.stderr)
            if "partial_only_graph_us" in row:
                print(f"  partial kernel alone: {row['partial_only_graph_us']:.2f} us", file=sys.stderr)
            if "timeline" in row:
                print(f"  timeline: {json.dumps(row['timeline'])}", file=sys.stderr)
        del sets, ref

    if args.floor and cuda:
        record["floor"] = floor_us(torch, triton, fd, device)
        print(f"floor: {record['floor']}", file=sys.stderr)
    print(table(record["rows"]))
    tuned = [r for r in record["rows"] if "graph_us" in r or "error" in r]
    if any(not r["default"] for r in tuned):
        print("\n" + tuning_table(tuned))
    if any(len(r.get("cluster_variants", [])) > 1 for r in record["rows"]):
        print("\n" + cluster_tuning_table(record["rows"]))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


def _fmt(row: dict, key: str, spec: str = ".1f") -> str:
    return format(row[key], spec) if key in row else "-"


def table(rows: list[dict]) -> str:
    """The default config of each problem, graph-replayed: ours against SDPA and against the ceilings."""
    head = (
        "| shape | ctx | B | splits | ours µs | % copy | one pass µs (%) | partial alone µs "
        "| read ceiling µs (%) | SDPA µs | SDPA % | speedup | max err | cluster µs (again) | cluster % "
        "| cluster splits | cluster err | ops picks |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in (r for r in rows if r["default"]):
        gspeed = (
            f"{r['sdpa_graph_us'] / r['graph_us']:.2f}x" if "graph_us" in r and "sdpa_graph_us" in r else "-"
        )
        one_pass = (
            f"{r['graph_one_pass_us']:.1f} ({r['graph_one_pass_pct_copy']:.0f})"
            if "graph_one_pass_pct_copy" in r
            else "-"
        )
        ceiling = "-"
        if "ceiling" in r:
            best = min(v for k, v in r["ceiling"].items() if k.startswith("read"))
            ceiling = f"{best:.1f} ({r['ceiling_pct_copy']['best_read']:.0f})"
        lines.append(
            f"| {r['shape']} | {r['ctx']} | {r['batch']} | {r['config']['num_splits']} | {_fmt(r, 'graph_us')} "
            f"| {_fmt(r, 'graph_pct_copy', '.0f')} | {one_pass} | {_fmt(r, 'partial_only_graph_us')} | {ceiling} "
            f"| {_fmt(r, 'sdpa_graph_us')} | {_fmt(r, 'sdpa_graph_pct_copy', '.0f')} | {gspeed} | {r['max_abs_err']:.1e} "
            f"| {cluster_cells(r)} | {r.get('ops_choice', {}).get('backend', '-')} |"
        )
    return "\n".join(lines)


def cluster_cells(r: dict) -> str:
    """The cluster kernel's columns of a problem's row (dashes when it did not run)."""
    c = r.get("cluster")
    if not c or "graph_us" not in c:
        return "- | - | - | -"
    again = f" ({c['graph_us_again']:.1f})" if "graph_us_again" in c else ""
    return (
        f"{c['graph_us']:.1f}{again} | {c['graph_pct_copy']:.0f} | {_plan_cell(c['config'])} "
        f"| {c['max_abs_err']:.1e}"
    )


def _plan_cell(config: dict) -> str:
    """CTAs a cluster, and 'x K' when K clusters serve a head."""
    k = config.get("num_clusters", 1)
    return f"{config['num_splits']}" + (f"x{k}" if k > 1 else "")


def cluster_tuning_table(rows: list[dict]) -> str:
    """Every timed cluster-kernel variant, best first within each problem."""
    lines = [
        "| shape | ctx | B | splits | stages | groups | pdl | layout | L2 promotion | order | graph µs | rel err |",
        "|---" * 12 + "|",
    ]
    for r in rows:
        for v in sorted(r.get("cluster_variants", []), key=lambda v: v.get("graph_us", math.inf)):
            c = v["config"]
            mark = " (default)" if v["default"] else " (probe: no attention)" if c.get("probe") else ""
            timing = f"{v['graph_us']:.1f}" if "graph_us" in v else v["error"][:60]
            lines.append(
                f"| {r['shape']} | {r['ctx']} | {r['batch']} | {_plan_cell(c)}{mark} | {c['stages']} "
                f"| {c['groups']} | {int(c['pdl'])} | {c['layout']} | {c['l2_promotion']} | {c['order']} | {timing} "
                f"| {v.get('rel_err', float('nan')):.1e} |"
            )
    return "\n".join(lines)


def tuning_table(rows: list[dict]) -> str:
    """Every timed variant (graph replay), best first within each problem; variants that failed last."""
    lines = [
        "| shape | ctx | B | splits | block_n | warps | stages | pdl | combine block_d | combine warps | pdl wait "
        "| graph µs | % copy | partial alone µs |",
        "|---" * 14 + "|",
    ]
    for r in sorted(rows, key=lambda r: (r["shape"], r["ctx"], r["batch"], r.get("graph_us", math.inf))):
        c = r["config"]
        mark = " (default)" if r["default"] else ""
        timing = f"{r['graph_us']:.1f}" if "graph_us" in r else r["error"][:40]
        lines.append(
            f"| {r['shape']} | {r['ctx']} | {r['batch']} | {c['num_splits']}{mark} | {c['block_n']} | {c['num_warps']} "
            f"| {c['num_stages']} | {int(c['pdl'])} | {c['combine_block_d']} | {c.get('combine_warps') or '-'} | {int(c['pdl_wait'])} | {timing} | {_fmt(r, 'graph_pct_copy', '.0f')} "
            f"| {_fmt(r, 'partial_only_graph_us', '.1f')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
