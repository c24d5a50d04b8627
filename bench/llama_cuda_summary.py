"""The summary of bench/llama_cuda.sh: llama.cpp (CUDA) vs our engine, decode tok/s at one context.

Reads, from the folder given, what the script left there: ``llama_build.json`` (the build's outcome
and seconds), ``llama_bench.json`` (llama-bench ``-o json``; a file cut short by a timeout is read up
to its last whole record), ``engine_bench.json`` (``python -m engine bench``'s record) and
``gguf.json`` (bench/gguf_random.py's line, if the script copied it there). Writes
``llama_vs_engine.json`` and ``llama_vs_engine.md`` beside them and prints the markdown.

    python3 bench/llama_cuda_summary.py OUT_DIR --ctx 4096 --gen 128 \\
        --llama-cmd "llama-bench ..." --engine-cmd "python3 -m engine bench ..."

The ratio is ours over llama.cpp's (above 1: our engine decodes faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    """The JSON in path, or None when it is missing, empty or unreadable."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def llama_records(path: Path) -> list[dict[str, Any]]:
    """llama-bench's test records: a whole JSON array, or the whole objects of one cut short."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    whole = read_json(path)
    if isinstance(whole, list):
        return [r for r in whole if isinstance(r, dict)]
    out: list[dict[str, Any]] = []
    dec = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            out.append(obj)
        i = text.find("{", end)
    return out


def find_test(
    records: list[dict[str, Any]], n_prompt: int, n_gen: int, n_depth: int
) -> dict[str, Any] | None:
    for r in records:
        if (r.get("n_prompt"), r.get("n_gen"), r.get("n_depth", 0)) == (n_prompt, n_gen, n_depth):
            return r
    return None


def _median_ts(r: dict[str, Any] | None) -> float | None:
    if not r:
        return None
    samples = r.get("samples_ts") or []
    return float(statistics.median(samples)) if samples else float(r["avg_ts"])


def summarize(out: Path, ctx: int, gen: int, llama_cmd: str = "", engine_cmd: str = "") -> dict[str, Any]:
    build = read_json(out / "llama_build.json") or {}
    gguf_info = read_json(out / "gguf.json")
    records = llama_records(out / "llama_bench.json")
    engine = read_json(out / "engine_bench.json")
    tg = find_test(records, 0, gen, ctx)
    pp = find_test(records, ctx, 0, 0)
    llama_decode = _median_ts(tg)
    llama_prefill = _median_ts(pp)
    ours_decode = float(engine["decode_tps"]) if isinstance(engine, dict) and "decode_tps" in engine else None
    ours_prefill = (
        float(engine["prefill_tps"]) if isinstance(engine, dict) and "prefill_tps" in engine else None
    )
    summary: dict[str, Any] = {
        "ctx": ctx,
        "gen": gen,
        "batch": 1,
        "build": build,
        "gguf": gguf_info,
        "llama": {
            "decode_tps_median": llama_decode,
            "decode_tps_avg": tg.get("avg_ts") if tg else None,
            "decode_tps_samples": tg.get("samples_ts") if tg else None,
            "prefill_tps_median": llama_prefill,
            "prefill_tps_samples": pp.get("samples_ts") if pp else None,
            "build_commit": (tg or pp or {}).get("build_commit"),
            "gpu_info": (tg or pp or {}).get("gpu_info"),
            "backends": (tg or pp or {}).get("backends"),
            "model_type": (tg or pp or {}).get("model_type"),
            "model_size": (tg or pp or {}).get("model_size"),
            "flash_attn": (tg or pp or {}).get("flash_attn"),
            "n_gpu_layers": (tg or pp or {}).get("n_gpu_layers"),
            "tests": [
                {k: r.get(k) for k in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "samples_ts")}
                for r in records
            ],
            "command": llama_cmd,
        },
        "engine": {
            "decode_tps_median": ours_decode,
            "decode_tps_runs": engine.get("decode_tps_runs") if isinstance(engine, dict) else None,
            "prefill_tps_median": ours_prefill,
            "random_weights": engine.get("random_weights") if isinstance(engine, dict) else None,
            "config": engine.get("config") if isinstance(engine, dict) else None,
            "command": engine_cmd,
        },
        "decode_ratio_engine_over_llama": (
            ours_decode / llama_decode if ours_decode and llama_decode else None
        ),
        "prefill_ratio_engine_over_llama": (
            ours_prefill / llama_prefill if ours_prefill and llama_prefill else None
        ),
    }
    return summary


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(s: dict[str, Any]) -> str:
    b, ll, en = s["build"], s["llama"], s["engine"]
    ctx, gen = s["ctx"], s["gen"]
    lines = [
        f"# llama.cpp (CUDA) vs our engine: decode at ctx {ctx}, batch 1, {gen} tokens",
        "",
    ]
    if b:
        state = b.get("status", "?")
        lines.append(
            f"- llama.cpp build: **{state}** in {b.get('build_s', '?')} s "
            f"(configure {b.get('configure_s', '?')} s, timeout {b.get('build_timeout_s', '?')} s, "
            f"-j {b.get('jobs', '?')}; commit {b.get('commit', '?')}, {b.get('source', '')})"
        )
        if b.get("nvcc"):
            lines.append(f"- toolchain: {b.get('nvcc')}; {b.get('cmake', '')}; {b.get('generator', '')}")
    g = s.get("gguf")
    if isinstance(g, dict):
        lines.append(
            f"- weights: random {g.get('shape')} GGUF, {g.get('dtype')}, {g.get('bytes', 0) / 1e9:.2f} GB, "
            f"{g.get('n_tensors')} tensors, written in {g.get('seconds')} s (bench/gguf_random.py)"
        )
    lines += [
        f"- GPU: {ll.get('gpu_info') or '?'}",
        "",
        "| engine | decode tok/s (median) | runs | prefill tok/s (median) |",
        "|---|---|---|---|",
        f"| llama.cpp {ll.get('build_commit') or ''} (tg{gen} @ d{ctx}, fa on, all layers on GPU) | "
        f"{_f(ll['decode_tps_median'])} | {', '.join(_f(x) for x in ll.get('decode_tps_samples') or [])} | "
        f"{_f(ll['prefill_tps_median'])} (pp{ctx}) |",
        f"| ours (random weights, same shape, {(en.get('config') or {}).get('dtype', '?')}) | "
        f"{_f(en['decode_tps_median'])} | "
        f"{', '.join(_f(x) for x in en.get('decode_tps_runs') or [])} | {_f(en['prefill_tps_median'])} |",
        "",
        f"**Decode ratio, ours / llama.cpp: {_f(s['decode_ratio_engine_over_llama'], 3)}**"
        f" (prefill: {_f(s['prefill_ratio_engine_over_llama'], 3)})",
        "",
        "Commands:",
        "",
        f"    {ll.get('command') or '(llama-bench not run)'}",
        f"    {en.get('command') or '(engine bench not run)'}",
    ]
    if ll.get("tests"):
        lines += [
            "",
            "llama-bench tests:",
            "",
            "| n_prompt | n_gen | n_depth | avg tok/s | ± |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {t['n_prompt']} | {t['n_gen']} | {t['n_depth']} | {_f(t['avg_ts'], 2)} | {_f(t['stddev_ts'], 2)} |"
            for t in ll["tests"]
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="summarize bench/llama_cuda.sh's results")
    parser.add_argument("out", type=Path)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--llama-cmd", default="")
    parser.add_argument("--engine-cmd", default="")
    args = parser.parse_args(argv)
    s = summarize(args.out, args.ctx, args.gen, args.llama_cmd, args.engine_cmd)
    (args.out / "llama_vs_engine.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    md = markdown(s)
    (args.out / "llama_vs_engine.md").write_text(md, encoding="utf-8")
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
