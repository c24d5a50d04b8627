"""End-to-end decode on a GPU: tok/s against the memory roofline, eager vs CUDA graph, same run.

The roofline is (weight bytes + KV bytes read per token) / measured copy bandwidth: batch-1 decode
must read every weight and the whole KV cache once per token, so no engine beats it. The copy
bandwidth is measured in the same process (a large device-to-device copy, bytes read + written).
Weights are random (real shapes), since model files cannot travel to the GPU box.

    python bench/e2e_decode.py --shape qwen3-8b --ctx 4096 --gen 128 --out e2e.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import ops
from engine.config import ModelConfig
from engine.generate import Session, load_random


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights one decode step reads (the embedding row aside)."""
    d, hd = cfg.d_model, cfg.head_dim
    per_layer = d * (cfg.n_head + 2 * cfg.n_kv_head) * hd + cfg.n_head * hd * d + 3 * d * cfg.d_ff + 2 * d
    return (cfg.n_layer * per_layer + cfg.vocab_size * d + d) * torch.finfo(dtype).bits // 8


def copy_bandwidth(nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def decode_tps(session: Session, prompt: list[int], gen: int, rounds: int) -> list[float]:
    """Greedy decode tok/s after prefilling the prompt, one value per round."""
    out = []
    for _ in range(rounds):
        session.reset()
        logits = session.forward(prompt)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        session.greedy_on_device(logits.argmax(), gen)
        torch.cuda.synchronize()
        out.append(gen / (time.perf_counter() - t0))
    return out


def profile_step(session: Session, prompt: list[int], gen: int, top: int = 25) -> dict:
    """Where a decode step's time goes: each kernel's device time and launches per token, and the
    step's wall time minus the sum of its kernels' (the gaps between kernels in the graph)."""
    from torch.profiler import ProfilerActivity, profile

    session.reset()
    logits = session.forward(prompt)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        session.greedy_on_device(logits.argmax(), gen)
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6 / gen
    kernels = sorted(
        (
            (e.key, e.device_time_total / gen, e.count / gen)
            for e in prof.key_averages()
            if e.device_time_total > 0
        ),
        key=lambda k: -k[1],
    )
    busy = sum(k[1] for k in kernels)
    out = {
        "tokens": gen,
        "wall_us_per_token": wall_us,
        "kernel_us_per_token": busy,
        "launches_per_token": sum(k[2] for k in kernels),
        "kernels": [
            {"name": n[:90], "us_per_token": t, "launches_per_token": c} for n, t, c in kernels[:top]
        ],
    }
    print(
        f"profile: {wall_us:.0f} us per token, kernels busy {busy:.0f} us ({out['launches_per_token']:.0f} launches)",
        file=sys.stderr,
    )
    for k in out["kernels"]:
        print(f"  {k['us_per_token']:8.1f} us  x{k['launches_per_token']:6.1f}  {k['name']}", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["eager", "cuda-graph", "compiled + cuda-graph"],
        choices=["eager", "cuda-graph", "compiled + cuda-graph"],
    )
    ap.add_argument(
        "--decode-kernels",
        nargs="+",
        default=["auto"],
        help="'auto' (ops' measured choice) and/or kernel names (engine.ops.DECODE_KERNELS), pinned",
    )
    ap.add_argument(
        "--profile", action="store_true", help="per-kernel device time of a compiled, graphed decode step"
    )
    args = ap.parse_args()
    bw = copy_bandwidth()
    lm = load_random(args.shape, "cuda", max_pos=args.ctx + args.gen + 1)
    cfg = lm.cfg
    prompt = torch.randint(
        0, cfg.vocab_size, (args.ctx,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    w_bytes = weight_bytes(cfg, lm.dtype)
    # the KV cache read per token at the mean context of the timed window
    mean_ctx = args.ctx + args.gen / 2
    kv_bytes = cfg.n_layer * 2 * cfg.n_kv_head * cfg.head_dim * mean_ctx * 2
    roofline = bw / (w_bytes + kv_bytes)
    rows = {}
    attn = {}
    compiled = False
    runs = [(m, kern) for m in args.modes for kern in args.decode_kernels]
    for mode, kern in runs:
        graph = mode != "eager"
        for block in lm.transformer.blocks:
            block.decode_kernel = None if kern == "auto" else kern
        if mode.startswith("compiled") and not compiled:
            t0 = time.perf_counter()
            lm.transformer.compile()  # compiles lazily: the warm-up below pays for it
            compiled = True
        elif not mode.startswith("compiled") and compiled:
            raise SystemExit("--modes: list the compiled mode last (compiling changes the model in place)")
        session = Session(lm, max_seq=args.ctx + args.gen + 1, cuda_graph=graph)
        decode_tps(session, prompt[:512], 8, 1)  # warm-up: Triton compiles, cuBLAS handles
        if mode.startswith("compiled"):
            print(f"torch.compile + capture took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        tps = decode_tps(session, prompt, args.gen, args.rounds)
        name = mode if len(args.decode_kernels) == 1 and kern == "auto" else f"{mode} [{kern}]"
        rows[name] = {
            "decode_tps": statistics.median(tps),
            "runs": tps,
            "pct_roofline": 100 * statistics.median(tps) / roofline,
        }
        attn[name] = ops.decode_config(cfg.n_head, session.cache, kernel=None if kern == "auto" else kern)
        print(
            f"{name}: {statistics.median(tps):.1f} tok/s; decode attention {attn[name].get('backend')}",
            file=sys.stderr,
        )
        if args.profile and mode.startswith("compiled"):
            rows[name]["profile"] = profile_step(session, prompt, args.gen)
        del session
        torch.cuda.empty_cache()
    result = {
        "date": str(date.today()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": args.shape,
        "ctx": args.ctx,
        "gen": args.gen,
        "batch": 1,
        "dtype": "bfloat16",
        "random_weights": True,
        "copy_bandwidth_GBps": bw / 1e9,
        "weight_bytes": w_bytes,
        "kv_bytes_per_token": kv_bytes,
        "roofline_tps": roofline,
        "decode_attention": attn,
        "modes": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(
        f"{result['device']}, torch {torch.__version__}, {date.today()}; copy bandwidth {bw / 1e9:.0f} GB/s (read+write)"
    )
    print(
        f"{args.shape} random weights, bf16, batch 1, ctx {args.ctx}, {args.gen} greedy tokens; "
        f"weights {w_bytes / 1e9:.2f} GB + KV {kv_bytes / 1e6:.0f} MB per token -> roofline {roofline:.1f} tok/s"
    )
    print("\n| mode | decode tok/s (median) | % of roofline | runs |")
    print("|---|---|---|---|")
    for mode, r in rows.items():
        print(
            f"| {mode} | {r['decode_tps']:.1f} | {r['pct_roofline']:.1f}% | {', '.join(f'{x:.1f}' for x in r['runs'])} |"
        )


if __name__ == "__main__":
    main()
