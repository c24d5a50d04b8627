"""Does where the weights sit in GPU memory move the decode rate, and does one packed layout fix it?

One process loads a random-weight shape once (compiled), then for each of R placements moves every weight
to new memory, builds a fresh session (KV cache, CUDA graph), and times M greedy requests at one context
(wall clock around a device sync, the tokens kept on the device):

- `loose`: each weight cloned on its own, in a random order, after a spacer of random size (as separate
  processes place them: wherever the allocator puts them);
- `packed`: `Transformer.pack()` (one allocation, aligned offsets, fixed order), after a random spacer.

It prints per variant the rate of each placement, the within-placement CV and the spread between
placements (sd of the placement means): the between-process offset of the served A/B, reproduced in one
process, and what packing leaves of it.

    python bench/gpu_placement.py --shape qwen3-8b --ctx 4096 --placements 6 --requests 4
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import generate as gen  # noqa: E402


def _loose(lm: gen.LoadedModel, rng: random.Random) -> None:
    tensors = lm.transformer.weights()
    rng.shuffle(tensors)
    lm.transformer.rebind({id(t): t.clone() for t in tensors})


def _time(lm: gen.LoadedModel, ctx: int, tokens: int, requests: int, rng: random.Random) -> list[float]:
    s = gen.Session(lm, max_seq=ctx + tokens + 8)
    vocab = lm.cfg.vocab_size
    for _ in range(2):
        s.generate([7 + i % 50 for i in range(64)], 4, stream=False)
    rates = []
    for _ in range(requests):
        s.reset()
        first = s.forward([rng.randrange(vocab) for _ in range(ctx)]).argmax(-1).view(1)
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.greedy_on_device(first, tokens - 1).tolist()
        rates.append((tokens - 1) / (time.perf_counter() - t0))
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--placements", type=int, default=6)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--variants", nargs="+", choices=("loose", "packed"), default=["loose", "packed"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = random.Random(3)
    t0 = time.monotonic()
    lm = gen.load_random(args.shape, args.device, seed=0, max_pos=args.ctx + args.tokens + 8)
    if args.device == "cuda":
        lm.transformer.compile()
    spacers = []
    record: dict[str, Any] = {"shape": args.shape, "ctx": args.ctx, "tokens": args.tokens, "variants": {}}
    for variant in args.variants:
        rows = []
        for _ in range(args.placements):
            spacers.append(
                torch.empty(rng.randrange(1, 1 << 28) // 512 * 512, dtype=torch.uint8, device=lm.device)
            )
            if variant == "loose":
                _loose(lm, rng)
            else:
                lm.transformer.pack()
            rates = _time(lm, args.ctx, args.tokens, args.requests, rng)
            rows.append(
                {"mean": statistics.fmean(rates), "cv": statistics.stdev(rates) / statistics.fmean(rates)}
            )
            print(
                json.dumps({"variant": variant, **{k: round(v, 5) for k, v in rows[-1].items()}}), flush=True
            )
        means = [r["mean"] for r in rows]
        summary = {
            "placements": len(rows),
            "tok_s_mean": round(statistics.fmean(means), 2),
            "between_placements_sd": round(statistics.stdev(means) / statistics.fmean(means), 5),
            "range": round((max(means) - min(means)) / statistics.fmean(means), 5),
            "within_cv_median": round(statistics.median(r["cv"] for r in rows), 5),
            "rows": rows,
        }
        print(
            json.dumps({"variant": variant, **{k: v for k, v in summary.items() if k != "rows"}}), flush=True
        )
        record["variants"][variant] = summary
    record["wall_s"] = round(time.monotonic() - t0, 1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
