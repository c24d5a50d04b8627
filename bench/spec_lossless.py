"""Losslessness and acceptance of speculative decoding on real models, CPU.

For each prompt (bench/spec_prompts.py) and context: one AR greedy run, then R speculative runs with
the draft model and R with the n-gram drafter; every run's tokens must equal the AR tokens.

    python bench/spec_lossless.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --ctx 128 512 --gen 64 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.spec_prompts import SECTIONS, prompt_ids
from engine import speculative as spec
from engine.generate import Session, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--ngram", type=int, default=3)
    ap.add_argument("--ctx", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--block", type=int, default=spec.DEFAULT_BLOCK)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    target, draft = load(args.target), load(args.draft)
    max_seq = max(args.ctx) + args.gen + args.block
    t_session, d_session = Session(target, max_seq), Session(draft, max_seq)
    drafters = {
        "draft-model": spec.DraftModelDrafter(d_session),
        f"ngram-{args.ngram}": spec.NgramDrafter(args.ngram),
    }
    rows = []
    for ctx in args.ctx:
        for section in SECTIONS:
            prompt = prompt_ids(target.tokenizer, section, ctx)
            ar = t_session.generate(prompt, args.gen)
            ar_tps = (len(ar.token_ids) - 1) / ar.decode_s
            for name, drafter in drafters.items():
                outs = [
                    spec.speculative_generate(t_session, drafter, prompt, args.gen, args.block)
                    for _ in range(args.runs)
                ]
                rep = spec.lossless_report(ar.token_ids, [o.token_ids for o in outs])
                row = {
                    "ctx": ctx,
                    "prompt": section,
                    "drafter": name,
                    "lossless": rep.lossless,
                    "lossless_runs": rep.lossless_runs,
                    "runs": rep.runs,
                    "first_divergence": rep.first_divergence,
                    "tau": statistics.mean(o.mean_accept for o in outs),
                    "ar_tps": ar_tps,
                    "spec_tps": statistics.median((len(o.token_ids) - 1) / o.decode_s for o in outs),
                }
                if rep.first_divergence is not None:
                    row["ar_margin_at_divergence"] = ar.margins[rep.first_divergence]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    print(
        f"{date.today()}; target {args.target}, draft {args.draft}; gen {args.gen}, B={args.block}, "
        f"{args.runs} runs per drafter; CPU fp32\n"
    )
    print("| ctx | prompt | drafter | lossless (runs) | τ | AR tok/s | spec tok/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['ctx']} | {r['prompt']} | {r['drafter']} | {r['lossless']} ({r['lossless_runs']}/{r['runs']}) | "
            f"{r['tau']:.2f} | {r['ar_tps']:.2f} | {r['spec_tps']:.2f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
