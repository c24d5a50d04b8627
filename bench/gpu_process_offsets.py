"""Where a fresh GPU serving process's own speed comes from: the per-process offset under four conditions.

Each fresh process of the same seeded engine (`python -m engine serve`, random-weight shape, compiled,
CUDA graph, `stream: ends`) is timed against one long-lived anchor process of the same code, pair by
pair (ABBA, the idle one frozen, the harness's own clock), so that the box's drift cancels and what is
left is the process's own offset. The conditions, cycled so that drift falls on all alike:

- `fresh`:  a fresh compile cache each, Inductor's default autotuning and the decode-attention kernel
            timed at load (`--tuning measured`): what a PR's process got before #40;
- `shared`: the same tuning, one shared warm compile cache (the anchor compiled it first);
- `pinned`: a fresh compile cache each, nothing chosen by timing at load (`--tuning pinned`: one
            Inductor config per kernel, the decode kernel from a table);
- `placed`: as `shared`, with every weight placed anew: a GPU spacer of random size (whole 2 MiB pages)
            is allocated before the load, so the weights, the cache and the graph land elsewhere.

The nvcc build of the CUDA decode extension is shared by every process (one TORCH_EXTENSIONS_DIR): its
binary is a function of its source and flags, not a runtime choice, and sharing it saves ~28 s a process.

Per condition it reports the between-process sd of the offsets (one-way ANOVA, less what the pairs' own
noise explains) and, for the fresh-cache conditions, which Inductor kernels got a config by timing
(`*.best_config` in the process's cache) and which of those differed from process to process, with the
mean offset of each distinct set of choices.

    python bench/gpu_process_offsets.py --shape qwen3-8b --ctx 4096 16384 --processes 4 --pairs 2 \\
        --conditions fresh pinned shared placed --budget-s 480 --out offsets.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from process_offsets import split  # noqa: E402

from evalbot.evaluate import abtest, sandbox  # noqa: E402
from evalbot.evaluate.schedule import run_alone  # noqa: E402
from evalbot.evaluate.served import ServedProcess  # noqa: E402

CONDITIONS = ("fresh", "shared", "pinned", "placed")
TUNING = {"fresh": "measured", "shared": "measured", "pinned": "pinned", "placed": "measured"}
SPACER = (
    "import sys, torch; keep = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device=sys.argv[2]); "
    "from engine.cli import main; raise SystemExit(main(sys.argv[3:]))"
)


def best_configs(cache: Path) -> dict[str, str]:
    """Inductor's autotuned choices in a compile cache: {kernel file stem: its chosen config, as JSON}."""
    out = {}
    for f in sorted(cache.rglob("*.best_config")):
        try:
            cfg = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        keep = {
            k: v
            for k, v in cfg.items()
            if k not in ("time_taken_ms", "triton_cache_hash", "found_by_coordesc")
        }
        out[f.name.split(".")[0]] = json.dumps(keep, sort_keys=True)
    return out


def differing(choices: list[dict[str, str]]) -> dict[str, list[str | None]]:
    """The kernels whose chosen config was not the same in every process: {kernel: each process's choice}."""
    names = sorted({k for c in choices for k in c})
    return {k: [c.get(k) for c in choices] for k in names if len({c.get(k) for c in choices}) > 1}


def by_signature(rows: list[dict[str, Any]], ctx: int) -> list[dict[str, Any]]:
    """Processes grouped by their whole set of choices (decode kernel and Inductor configs): each group's
    mean offset at ctx, so a choice that moves the speed shows as groups apart."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        sig = json.dumps([r["decode_backend"], sorted(r["best_configs"].items())], sort_keys=True)
        groups.setdefault(sig, []).append(r["offset"][str(ctx)])
    return [
        {
            "processes": len(v),
            "mean_offset": round(statistics.fmean(v), 5),
            "offsets": [round(x, 5) for x in v],
        }
        for v in sorted(groups.values(), key=len, reverse=True)
    ]


def summarize(rows: list[dict[str, Any]], contexts: list[int]) -> dict[str, Any]:
    """Per context: the ANOVA split of the processes' pair log-ratios against the anchor."""
    out: dict[str, Any] = {"processes": len(rows)}
    for ctx in contexts:
        ratios = [r["ratios"][str(ctx)] for r in rows if len(r["ratios"][str(ctx)]) >= 2]
        if len(ratios) >= 2:
            s = split(ratios)
            out[str(ctx)] = {
                "between_sd": round(s["between_sd"], 5),
                "within_sd": round(s["within_sd"], 5),
                "offset_sd": round(s["process_mean_sd"], 5),
                "mean_ratio": round(s["mean_rate"], 5),
                "offsets": [round(r["offset"][str(ctx)], 5) for r in rows],
            }
    fresh_cache = [r for r in rows if r["own_cache"]]
    if fresh_cache:
        choices = [r["best_configs"] for r in fresh_cache]
        out["autotuned_kernels"] = [len(c) for c in choices]
        out["differing_kernels"] = differing(choices)
        out["decode_backends"] = [r["decode_backend"] for r in rows]
        out["signatures"] = {str(ctx): by_signature(fresh_cache, ctx) for ctx in contexts}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--ctx", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cuda (the experiment); cpu only checks the script runs")
    ap.add_argument("--processes", type=int, default=4, help="per condition")
    ap.add_argument("--pairs", type=int, default=2, help="timed pairs per context and process")
    ap.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    ap.add_argument("--budget-s", type=float, default=480, help="start no process that would end past this")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpu-offsets-"))
    shared_cache, ext = work / "shared-cache", work / "torch-extensions"
    shared_cache.mkdir()
    ext.mkdir()
    max_seq = max(args.ctx) + args.tokens + 16
    rng = random.Random(11)
    serial = iter(range(1, 1 << 30))

    def start(label: str, cache: Path, tuning: str, spacer_mb: int = 0) -> tuple[ServedProcess, float]:
        scratch = work / f"{label}-scratch"
        scratch.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")}
        env |= {
            "HOME": str(scratch),
            "PYTHONUNBUFFERED": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "XDG_CACHE_HOME": str(cache / "xdg"),
            "TORCH_EXTENSIONS_DIR": str(ext),
        }
        spec = sandbox.SandboxSpec(
            ro_binds=(ROOT,),
            scratch=work,
            workdir=ROOT,
            env=env,
            limits=sandbox.Limits(cpu_seconds=36000, timeout_s=36000.0, max_output_bytes=64 << 20),
        )
        serve = [
            "serve",
            "--random-weights",
            "--shape",
            args.shape,
            "--device",
            args.device,
            "--max-seq",
            str(max_seq),
        ]
        serve += ["--seed", "0", "--tuning", tuning]
        argv = (
            [sys.executable, "-c", SPACER, str(spacer_mb), args.device, *serve]
            if spacer_mb
            else [sys.executable, "-m", "engine", *serve]
        )
        t0 = time.monotonic()
        p = ServedProcess.start(label, spec, argv, no_sandbox=True)
        p.wait_ready(900)
        p.freeze()
        return p, time.monotonic() - t0

    def request(p: ServedProcess, others: list[ServedProcess], ctx: int) -> float:
        body = {
            "op": "generate",
            "prompt_ids": source(ctx, next(serial)),
            "max_new": args.tokens,
            "stream": "ends",
        }
        return run_alone(p, others, partial(p.request, body, 600)).decode_tps

    anchor, anchor_s = start("anchor", shared_cache, "measured")
    source = abtest.random_prompts(anchor.vocab, 5)  # a fresh prompt for every request
    for ctx in args.ctx:
        request(anchor, [], ctx)
    result: dict[str, Any] = {
        "args": vars(args),
        "anchor": {"ready_s": round(anchor_s, 1), "config": anchor.ready.get("config")},
        "rows": {c: [] for c in args.conditions},
    }
    longest = anchor_s
    plan = [(i, cond) for i in range(args.processes) for cond in args.conditions]
    try:
        for i, cond in plan:
            spent = time.monotonic() - t_start
            if spent + longest + 10 * len(args.ctx) * (args.pairs + 1) > args.budget_s:
                result["stopped"] = f"budget: {spent:.0f} s spent before {cond} process {i + 1}"
                break
            own = cond in ("fresh", "pinned")
            cache = work / f"{cond}-{i}-cache" if own else shared_cache
            spacer = rng.randrange(1, 2048) * 2 if cond == "placed" else 0
            p, ready_s = start(f"{cond}-{i}", cache, TUNING[cond], spacer)
            longest = max(longest, ready_s)
            row: dict[str, Any] = {"ready_s": round(ready_s, 1), "own_cache": own, "spacer_mb": spacer}
            try:
                ratios: dict[str, list[float]] = {}
                rates: dict[str, list[list[float]]] = {}
                for ctx in args.ctx:
                    request(p, [anchor], ctx)  # untimed: this context's prefill compiles here
                    ratios[str(ctx)], rates[str(ctx)] = [], []
                    for k in range(args.pairs):
                        order = (p, anchor) if k % 2 == 0 else (anchor, p)
                        got = {q.label: request(q, [x for x in order if x is not q], ctx) for q in order}
                        ratios[str(ctx)].append(got[p.label] / got["anchor"])
                        rates[str(ctx)].append([got[p.label], got["anchor"]])
                cfg = p.ready.get("config") or {}
                row |= {
                    "ratios": ratios,
                    "rates": rates,
                    "offset": {c: statistics.fmean(math.log(x) for x in v) for c, v in ratios.items()},
                    "decode_backend": (cfg.get("decode_attention") or {}).get("backend"),
                    "decode_choice": cfg.get("decode_attention"),
                    "compiled_with": cfg.get("compiled_with"),
                }
            finally:
                p.close()
            row["best_configs"] = best_configs(cache) if own else {}
            if own:
                shutil.rmtree(cache, ignore_errors=True)
            result["rows"][cond].append(row)
            offs = " ".join(f"{c}: {100 * v:+.2f}%" for c, v in row["offset"].items())
            print(
                f"{cond} {i + 1}: ready {ready_s:.0f} s, {row['decode_backend']}, "
                f"{len(row['best_configs'])} autotuned, offset {offs}",
                file=sys.stderr,
                flush=True,
            )
            result["summary"] = {c: summarize(r, args.ctx) for c, r in result["rows"].items() if r}
            result["wall_s"] = round(time.monotonic() - t_start, 1)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        anchor.close()
    result["summary"] = {c: summarize(r, args.ctx) for c, r in result["rows"].items() if r}
    result["wall_s"] = round(time.monotonic() - t_start, 1)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        "| condition | processes | ctx | between-process sd | pair noise (within) | mean ratio to anchor | autotuned kernels | differing |"
    )
    print("|---|--:|--:|--:|--:|--:|---|--:|")
    for cond, s in result["summary"].items():
        for ctx in args.ctx:
            if str(ctx) in s:
                c = s[str(ctx)]
                print(
                    f"| {cond} | {s['processes']} | {ctx} | {100 * c['between_sd']:.3f}% | {100 * c['within_sd']:.3f}% | "
                    f"{c['mean_ratio']:.4f} | {s.get('autotuned_kernels', '-')} | {len(s.get('differing_kernels', {}))} |"
                )


if __name__ == "__main__":
    main()
