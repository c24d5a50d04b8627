"""The llama.cpp reference's command line (the library is `evalbot.reference.llama`): score, greedy generate,
audit and bench, in the engine's protocol.

Each command prints one JSON record (evalbot.reference.record) on stdout, so that
``python -m evalbot.reference.compare`` can set an engine's scores beside the reference's. Text is tokenized
with llama.cpp's own tokenizer (the engines then score the reference's token ids, never their own), and
flash attention is pinned off and recorded. Score results
are deterministic and cached under ``$EVALBOT_CACHE/reference`` (else ``~/.cache/evalbot/reference``), keyed
by the model's sha256, the reference build's identity (version, pinned flags, sha256 of its libraries:
``evalbot.reference.build``), the flash-attention setting and the token ids. A llama.cpp that is not the
pinned portable build (a native one, with AVX-512 or AMX compiled in) is refused with the reason.

    python -m evalbot.reference score --model qwen2.5-coder-0.5b --text-file T.txt --positions 256 --out ref.npy
    python -m evalbot.reference audit --model M.gguf --requests requests.jsonl --out answers.jsonl
    python -m evalbot.reference generate --model qwen2.5-coder-0.5b --prompt "def fib(n):" --max-new 32
    python -m evalbot.reference bench --model qwen2.5-coder-0.5b --text-file T.txt --ctx 512 --gen 32 --runs 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from evalbot.reference.llama import (
    ENGINE_NAME,
    FLASH_ATTN,
    ReferenceFailure,
    audit_sequences,
    bench_ids,
    build_identity,
    greedy_generate,
    load_tokenizer,
    score_ids,
)
from evalbot.reference.record import emit, make_record
from evalbot.reference.registry import FetchError, model_sha256, resolve


def _ids_from(path: str) -> list[int]:
    """token_ids of a score record (REF.json, or REF.npy whose REF.npy.json sidecar holds it)."""
    p = Path(path)
    if p.suffix == ".npy":
        p = Path(f"{p}.json")
    try:
        ids = json.loads(p.read_text()).get("token_ids")
    except (OSError, ValueError, AttributeError) as exc:
        raise ReferenceFailure(f"cannot read token_ids from {p}: {exc}") from exc
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ReferenceFailure(f"{p} has no token_ids list of integers")
    return ids


def cmd_score(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve(args.model)
    sha = model_sha256(path)
    t0 = time.perf_counter()
    if args.ids_from:
        ids = _ids_from(args.ids_from)
        source = f"ids from {args.ids_from}"
        positions = args.positions if args.positions is not None else len(ids) - 1
    else:
        if args.positions is None:
            raise ReferenceFailure("--positions is required with --text-file")
        ids = load_tokenizer(path).encode(Path(args.text_file).read_text(encoding="utf-8"))
        source = args.text_file
        positions = args.positions
    tokenize_s = time.perf_counter() - t0
    if positions <= 0:
        raise ReferenceFailure(f"--positions must be positive, got {positions}")
    if len(ids) < positions + 1:
        raise ReferenceFailure(
            f"{source} has {len(ids)} tokens; scoring {positions} positions needs {positions + 1}"
        )
    ids = ids[: positions + 1]
    res = score_ids(path, ids, model_sha=sha, n_threads=args.threads, use_cache=not args.no_cache)
    arr = res.logprobs
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:  # a file object, so np.save does not append ".npy" to the name
        np.save(f, arr)
    targets = np.asarray(ids[1:])
    nll = (-arr[np.arange(positions), targets].astype(np.float64)).tolist()
    mean_nll = float(np.mean(nll))
    record = make_record(
        "score",
        engine=ENGINE_NAME,
        model_sha256=sha,
        device="cpu",
        config=res.config,
        timings={"tokenize_s": tokenize_s, **res.timings},
        counts={"positions": positions, "n_vocab": int(arr.shape[1])},
        path=str(out),
        token_ids=ids,
        argmax=arr.argmax(axis=1).tolist(),
        nll=nll,
        mean_nll=mean_nll,
        ppl=float(np.exp(mean_nll)),
        cached=res.cached,
        cache_key=res.cache_key,
        computed_timings=res.computed_timings,
    )
    Path(f"{out}.json").write_text(json.dumps(record, allow_nan=False))
    return record


def cmd_generate(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve(args.model)
    sha = model_sha256(path)
    tok = load_tokenizer(path)
    if args.prompt_ids is not None:
        try:
            prompt_ids = json.loads(args.prompt_ids)
        except ValueError as exc:
            raise ReferenceFailure(f"--prompt-ids is not a JSON list: {exc}") from exc
        if not isinstance(prompt_ids, list) or not all(isinstance(i, int) for i in prompt_ids):
            raise ReferenceFailure("--prompt-ids must be a JSON list of integers")
        text = tok.decode(prompt_ids)
    else:
        text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else args.prompt
        prompt_ids = tok.encode(text)
    out = greedy_generate(
        path,
        prompt_ids,
        args.max_new,
        stop_ids=tok.eot_ids if args.stop else frozenset(),
        n_threads=args.threads,
    )
    ids, t = out["token_ids"], out["timings"]
    decode_steps = max(len(ids) - 1, 0)  # the first new token comes out of prefill
    return make_record(
        "generate",
        engine=ENGINE_NAME,
        model_sha256=sha,
        device="cpu",
        config={**out["config"], "temperature": 0.0, "stop": bool(args.stop)},
        timings=t,
        counts={"prompt_tokens": len(prompt_ids), "new_tokens": len(ids), "decode_steps": decode_steps},
        prompt=text,
        prompt_ids=prompt_ids,
        token_ids=ids,
        text=tok.decode(ids),
        stop_reason=out["stop_reason"],
        margins=out["margins"],
        min_margin=min(out["margins"]),
        prefill_tps=len(prompt_ids) / t["prefill_s"] if t["prefill_s"] else 0.0,
        decode_tps=decode_steps / t["decode_s"] if t["decode_s"] else 0.0,
    )


def cmd_bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.ctx <= 0:
        raise ReferenceFailure(f"--ctx must be positive, got {args.ctx}")
    path = resolve(args.model)
    sha = model_sha256(path)
    ids = load_tokenizer(path).encode(Path(args.text_file).read_text(encoding="utf-8"))
    if not ids:
        raise ReferenceFailure(f"{args.text_file} tokenizes to nothing")
    prompt = (ids * -(-args.ctx // len(ids)))[: args.ctx]  # tiled if short, then cut
    out = bench_ids(path, prompt, args.gen, runs=args.runs, warmup=args.warmup, n_threads=args.threads)
    return make_record(
        "bench",
        engine=ENGINE_NAME,
        model_sha256=sha,
        device="cpu",
        config={
            **out.pop("config"),
            "ctx": args.ctx,
            "gen": args.gen,
            "runs": args.runs,
            "warmup": args.warmup,
            "prompt": f"{args.text_file} tiled",
        },
        timings=out.pop("timings"),
        counts={"ctx": args.ctx, "gen": args.gen, "runs": args.runs},
        **out,
    )


def cmd_audit(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve(args.model)
    sha = model_sha256(path)
    items = []
    for number, line in enumerate(Path(args.requests).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            ok = (
                isinstance(item, dict)
                and isinstance(item.get("key"), str)
                and all(
                    isinstance(item.get(f), list) and item[f] and all(isinstance(t, int) for t in item[f])
                    for f in ("prompt", "tokens")
                )
            )
        except ValueError:
            ok = False
        if not ok:
            raise ReferenceFailure(
                f"{args.requests}:{number}: expected {{key, prompt: [ids], tokens: [ids]}}"
            )
        items.append(item)
    t0 = time.perf_counter()
    results = audit_sequences(path, items, model_sha=sha, n_threads=args.threads)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in results))
    return make_record(
        "audit",
        engine=ENGINE_NAME,
        model_sha256=sha,
        device="cpu",
        config={"flash_attn": FLASH_ATTN, "reference_build": build_identity()},
        timings={"audit_s": time.perf_counter() - t0},
        counts={"sequences": len(items), "cached": sum(r["cached"] for r in results)},
        path=str(args.out),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evalbot.reference", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model",
            required=True,
            help="registry name (see python -m evalbot.reference.registry list) or GGUF path",
        )
        p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: all usable cores)")

    s = sub.add_parser("score", help="teacher-forced full-vocabulary log-probabilities")
    common(s)
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--text-file", help="text to tokenize (with llama.cpp's tokenizer)")
    src.add_argument(
        "--ids-from", metavar="REF.json", help="take token_ids from a score record (or its .npy)"
    )
    s.add_argument("--positions", type=int, help="positions to score (default with --ids-from: all)")
    s.add_argument("--out", required=True, help="where to write the (P, V) float32 .npy")
    s.add_argument("--no-cache", action="store_true", help="neither read nor write the reference cache")
    s.set_defaults(func=cmd_score)

    g = sub.add_parser("generate", help="greedy continuation of a prompt")
    common(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    src.add_argument(
        "--prompt-ids", metavar="JSON", help="prompt token ids as a JSON list (no template applied)"
    )
    g.add_argument("--max-new", type=int, default=64)
    g.add_argument("--no-stop", dest="stop", action="store_false", help="do not stop at end-of-turn tokens")
    g.set_defaults(func=cmd_generate)

    a = sub.add_parser("audit", help="argmax and top-2 margin at every generated position, teacher-forced")
    common(a)
    a.add_argument("--requests", required=True, help="JSON lines {key, prompt: [ids], tokens: [ids]}")
    a.add_argument("--out", required=True, help="JSON lines {key, argmax, margin, cached}")
    a.set_defaults(func=cmd_audit)

    b = sub.add_parser("bench", help="prefill and decode throughput at a context length")
    common(b)
    b.add_argument("--text-file", required=True, help="text whose tokens (tiled if short) make the context")
    b.add_argument("--ctx", type=int, required=True, help="context tokens before decoding")
    b.add_argument("--gen", type=int, default=32, help="decode steps timed after the context")
    b.add_argument("--runs", type=int, default=1)
    b.add_argument("--warmup", type=int, default=1)
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        build_identity()  # a missing or non-portable reference fails here, before any model is loaded
        emit(args.func(args))
    except (ReferenceFailure, FetchError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
