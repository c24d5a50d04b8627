"""`python -m engine generate|bench|score`: each prints one JSON record on stdout (engine.protocol).

Human-readable text (streamed tokens, progress) goes to stderr, so stdout stays machine-readable.
"""

from __future__ import annotations

import argparse
import codecs
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine import generate as gen
from engine import ops, options, serve
from engine import speculative as spec
from engine.gguf import GGUFError
from engine.model_file import ModelFileError
from engine.prompts import tokens_of_length
from engine.protocol import emit, make_record
from engine.sampling import SamplingParams
from engine.shapes import SHAPES
from engine.speculative import DEFAULT_BLOCK
from engine.tokenizer import TokenizerError

ENGINE_NAME = "evalbot-engine"


def _config(lm: gen.LoadedModel, session: gen.Session, **extra: Any) -> dict[str, Any]:
    cfg = lm.cfg
    return {
        "arch": cfg.arch,
        "device": str(lm.device),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "prefill_chunk": session.prefill_chunk,
        "max_seq": session.max_seq,
        "cuda_graph": session.graphed,
        **({"block": session.block, "block_split": session.split} if session.block else {}),
        "random_weights": lm.random_weights,
        "torch": torch.__version__,
        "decode_attention": ops.decode_config(
            cfg.n_head,
            session.cache,
            lm.transformer.blocks[0].decode_splits,
            lm.transformer.blocks[0].decode_kernel,
        ),
        **extra,
    }


def _record(
    command: str,
    lm: gen.LoadedModel,
    config: dict[str, Any],
    timings: dict[str, float],
    counts: dict[str, int],
    **fields: Any,
) -> dict[str, Any]:
    return make_record(
        command,
        engine=ENGINE_NAME,
        model_sha256=lm.sha256,
        device=str(lm.device),
        config=config,
        timings={"load_s": lm.load_s, **timings},
        counts=counts,
        **fields,
    )


def cmd_generate(args: argparse.Namespace) -> dict[str, Any]:
    lm = gen.load(args.model, args.device)
    tok = lm.tokenizer
    assert tok is not None  # a model file always carries its tokenizer (only random weights have none)
    text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else args.prompt
    if args.chat:
        text = tok.apply_chat_template([{"role": "user", "content": text}])
    prompt_ids = tok.encode(text)
    session = gen.Session(lm, max_seq=len(prompt_ids) + args.max_new)
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)

    # tokens are byte pieces that may split a UTF-8 character: decode incrementally
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def stream(token: int) -> None:
        if not args.quiet:
            sys.stderr.write(utf8.decode(tok.token_to_piece(token)))
            sys.stderr.flush()

    out = session.generate(
        prompt_ids, args.max_new, params, stop_ids=tok.eot_ids if args.stop else frozenset(), on_token=stream
    )
    if not args.quiet:
        sys.stderr.write(utf8.decode(b"", final=True) + "\n")
    n_new = len(out.token_ids)
    decode_steps = max(n_new - 1, 0)  # the first new token comes out of prefill
    config = _config(
        lm,
        session,
        **asdict(params),  # the sampling parameters as the run used them
        chat=args.chat,
    )
    return _record(
        "generate",
        lm,
        config,
        timings={"prefill_s": out.prefill_s, "decode_s": out.decode_s},
        counts={"prompt_tokens": len(prompt_ids), "new_tokens": n_new, "decode_steps": decode_steps},
        prompt=text,
        token_ids=out.token_ids,
        text=tok.decode(out.token_ids),
        stop_reason=out.stop_reason,
        prefill_tps=len(prompt_ids) / out.prefill_s if out.prefill_s else 0.0,
        decode_tps=decode_steps / out.decode_s if out.decode_s else 0.0,
    )


def bench_once(session: gen.Session, prompt: list[int], n_gen: int) -> tuple[float, float]:
    """(prefill seconds for the prompt, decode seconds for n_gen greedy single-token steps after it)."""
    session.reset()
    session._sync()
    t0 = time.perf_counter()
    logits = session.forward(prompt)
    session._sync()
    t1 = time.perf_counter()
    if session.on_cuda:
        session.greedy_on_device(logits.argmax(), n_gen)  # tokens stay on the GPU: no host sync per step
    else:
        token = int(logits.argmax())
        for _ in range(n_gen):
            token = int(session.forward([token]).argmax())
    session._sync()
    return t1 - t0, time.perf_counter() - t1


def _bench_model(args: argparse.Namespace, extra_positions: int = 1) -> gen.LoadedModel:
    if args.random_weights:
        if not args.shape:
            raise ValueError("--random-weights needs --shape (one of: " + ", ".join(sorted(SHAPES)) + ")")
        return gen.load_random(
            args.shape, args.device, seed=args.seed, max_pos=args.ctx + args.gen + extra_positions
        )
    if not args.model:
        raise ValueError("bench needs --model, or --random-weights --shape NAME")
    return gen.load(args.model, args.device)


def cmd_bench(args: argparse.Namespace) -> dict[str, Any]:
    lm = _bench_model(args)
    if lm.tokenizer is None:  # random weights: token ids carry no meaning, a seeded draw will do
        g = torch.Generator().manual_seed(args.seed)
        prompt = torch.randint(0, lm.cfg.vocab_size, (args.ctx,), generator=g).tolist()
    else:
        text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else None
        prompt = tokens_of_length(lm.tokenizer, args.ctx, text)
    for block in lm.transformer.blocks:
        block.decode_splits = args.num_splits
    compiled = lm.device.type == "cuda" if args.compile is None else args.compile
    if compiled:
        lm.transformer.compile()
    session = gen.Session(lm, max_seq=args.ctx + args.gen + 1, cuda_graph=args.cuda_graph)
    t_warm = time.perf_counter()
    for _ in range(args.warmup):
        bench_once(session, prompt[: min(len(prompt), 64)], min(args.gen, 4))
    warmup_s = (
        time.perf_counter() - t_warm
    )  # compile and caches settle here; reported so nothing goes untimed
    prefill, decode = [], []
    for r in range(args.runs):
        p, d = bench_once(session, prompt, args.gen)
        prefill.append(args.ctx / p)
        decode.append(args.gen / d)
        print(
            f"run {r + 1}/{args.runs}: prefill {prefill[-1]:.1f} tok/s, decode {decode[-1]:.2f} tok/s",
            file=sys.stderr,
        )
    config = _config(
        lm,
        session,
        ctx=args.ctx,
        gen=args.gen,
        runs=args.runs,
        warmup=args.warmup,
        compile=compiled,
        prompt="random ids" if lm.tokenizer is None else args.prompt_file or "engine/data/corpus.txt tiled",
    )
    return _record(
        "bench",
        lm,
        config,
        timings={
            "warmup_s": warmup_s,
            "prefill_s": sum(args.ctx / x for x in prefill),
            "decode_s": sum(args.gen / x for x in decode),
        },
        counts={"ctx": args.ctx, "gen": args.gen, "runs": args.runs},
        prefill_tps=statistics.median(prefill),
        decode_tps=statistics.median(decode),
        prefill_tps_runs=prefill,
        decode_tps_runs=decode,
        random_weights=lm.random_weights,
    )


def cmd_score(args: argparse.Namespace) -> dict[str, Any]:
    lm = gen.load(args.model, args.device)
    text = Path(args.text_file).read_text(encoding="utf-8")
    assert lm.tokenizer is not None  # a model file always carries its tokenizer
    ids = lm.tokenizer.encode(text)
    if len(ids) < args.positions + 1:
        raise ValueError(
            f"{args.text_file} has {len(ids)} tokens; scoring {args.positions} positions needs {args.positions + 1}"
        )
    ids = ids[: args.positions + 1]
    session = gen.Session(lm, max_seq=len(ids))
    t0 = time.perf_counter()
    logprobs = session.score(ids)
    score_s = time.perf_counter() - t0
    arr = logprobs.cpu().numpy().astype(np.float32)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, arr)
    targets = torch.tensor(ids[1:])
    nll = (-logprobs.gather(1, targets[:, None]).squeeze(1)).tolist()
    mean_nll = float(np.mean(nll))
    record = _record(
        "score",
        lm,
        _config(lm, session),
        timings={"score_s": score_s},
        counts={"positions": args.positions, "n_vocab": int(arr.shape[1])},
        path=str(out),
        token_ids=ids,
        argmax=logprobs.argmax(-1).tolist(),
        nll=nll,
        mean_nll=mean_nll,
        ppl=float(np.exp(mean_nll)),
    )
    Path(str(out) + ".json").write_text(json.dumps(record))
    return record


def cmd_spec(args: argparse.Namespace) -> dict[str, Any]:
    if (args.draft is None) == (args.ngram is None):
        raise ValueError("spec needs exactly one drafter: --draft MODEL or --ngram N")
    lm = _bench_model(args, extra_positions=args.block)
    if lm.tokenizer is None:
        # random weights: a repetitive prompt (one seeded 32-token phrase, tiled) gives n-gram lookup material
        g = torch.Generator().manual_seed(args.seed)
        phrase = torch.randint(0, lm.cfg.vocab_size, (32,), generator=g).tolist()
        prompt = (phrase * (args.ctx // 32 + 1))[: args.ctx]
    else:
        text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else None
        prompt = tokens_of_length(lm.tokenizer, args.ctx, text)
    max_seq = args.ctx + args.gen + args.block
    compiled = lm.device.type == "cuda" if args.compile is None else args.compile
    if compiled:
        lm.transformer.compile()
    # --invariant: decode and verify are one fixed-width block (row-invariant), so the check is bit-exact
    target = gen.Session(lm, max_seq=max_seq, block=args.block if args.invariant else 0)
    # plain decode on the engine's fastest path, for the speed comparison (and the same prompt's tokens)
    plain = gen.Session(lm, max_seq=max_seq) if args.invariant else target
    draft_lm = None
    if args.draft is not None:
        draft_lm = gen.load(args.draft, args.device)
        if draft_lm.cfg.vocab_size != lm.cfg.vocab_size:
            raise ValueError(
                f"draft vocabulary {draft_lm.cfg.vocab_size} differs from the target's {lm.cfg.vocab_size}"
            )
        drafter: spec.Drafter = spec.DraftModelDrafter(gen.Session(draft_lm, max_seq=max_seq))
    else:
        drafter = spec.NgramDrafter(args.ngram)
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    ar_tps: list[float] = []
    spec_tps: list[float] = []
    runs: list[list[int]] = []
    hist: Counter[int] = Counter()
    ar = None
    plain_tps: list[float] = []
    block_tps: list[float] = []
    for r in range(args.runs):  # interleaved AR / speculative, same process, same model load
        ar = target.generate(prompt, args.gen, params)
        ar_tps.append((len(ar.token_ids) - 1) / ar.decode_s)
        if params.greedy:  # decode alone, tokens kept on the device: the rate speculation must beat
            plain_tps.append((args.gen - 1) / bench_once(plain, prompt, args.gen - 1)[1])
            if plain is not target:  # and the row-invariant block decode's own rate, the same way
                block_tps.append((args.gen - 1) / bench_once(target, prompt, args.gen - 1)[1])
        out = spec.speculative_generate(target, drafter, prompt, args.gen, args.block, params)
        spec_tps.append((len(out.token_ids) - 1) / out.decode_s)
        runs.append(out.token_ids)
        hist.update(out.accept_hist)
        print(
            f"run {r + 1}/{args.runs}: AR {ar_tps[-1]:.2f} tok/s, "
            + (f"plain decode {plain_tps[-1]:.2f} tok/s, " if plain_tps else "")
            + (f"block decode {block_tps[-1]:.2f} tok/s, " if block_tps else "")
            + f"spec {spec_tps[-1]:.2f} tok/s, tau {out.mean_accept:.2f}",
            file=sys.stderr,
        )
    assert ar is not None
    steps = sum(hist.values())
    report = spec.lossless_report(ar.token_ids, runs) if params.greedy else None
    divergence = report.first_divergence if report else None
    config = _config(
        lm,
        target,
        drafter=drafter.name,
        draft_model_sha256=draft_lm.sha256 if draft_lm else None,
        block_size=args.block,
        invariant=bool(args.invariant),
        compile=compiled,
        ctx=args.ctx,
        gen=args.gen,
        runs=args.runs,
        **asdict(params),  # the sampling parameters as the run used them
        prompt=(
            "repetitive random ids"
            if lm.random_weights
            else args.prompt_file or "engine/data/corpus.txt tiled"
        ),
    )
    return _record(
        "spec",
        lm,
        config,
        timings={
            "ar_decode_s": sum((len(ar.token_ids) - 1) / x for x in ar_tps),
            "spec_decode_s": sum((args.gen - 1) / x for x in spec_tps),
        },
        counts={"ctx": args.ctx, "gen": args.gen, "runs": args.runs, "verify_steps": steps},
        ar_tps=statistics.median(ar_tps),
        spec_tps=statistics.median(spec_tps),
        ar_tps_runs=ar_tps,
        spec_tps_runs=spec_tps,
        plain_decode_tps=statistics.median(plain_tps) if plain_tps else None,
        plain_decode_tps_runs=plain_tps,
        block_decode_tps=statistics.median(block_tps) if block_tps else None,
        block_decode_tps_runs=block_tps,
        mean_accept=sum(k * v for k, v in hist.items()) / steps,
        block_size=args.block,
        accept_hist={str(k): hist[k] for k in range(1, args.block + 1)},
        lossless=report.lossless if report else None,
        lossless_runs=report.lossless_runs if report else None,
        first_divergence=divergence,
        ar_margin_at_divergence=ar.margins[divergence]
        if divergence is not None and divergence < len(ar.margins)
        else None,
        ar_token_ids=ar.token_ids,
        spec_token_ids=runs[0],
        random_weights=lm.random_weights,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="A compact GGUF inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, model_required: bool = True) -> None:
        p.add_argument(
            "--model",
            required=model_required,
            help="GGUF path, or the name of a model evalbot fetched (python -m evalbot.reference.registry list)",
        )
        p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
        p.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's choice)")

    g = sub.add_parser("generate", help="generate text from a prompt")
    common(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--max-new", type=int, default=64)
    options.add_sampling(g)
    g.add_argument("--no-stop", dest="stop", action="store_false", help="do not stop at end-of-turn tokens")
    g.add_argument("--quiet", action="store_true", help="do not stream tokens to stderr")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="prefill and decode throughput at a context length")
    common(b, model_required=False)
    options.add_random_weights(b)
    b.add_argument("--seed", type=int, default=0)
    options.add_prompt_file(b)
    b.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", help="decode eagerly on CUDA")
    b.add_argument(
        "--num-splits", type=int, default=None, help="pin the flash-decode KV split count (A/B only)"
    )
    options.add_compile(b)
    b.add_argument("--ctx", type=int, required=True, help="context tokens before decoding")
    b.add_argument("--gen", type=int, default=32, help="decode steps timed after the context")
    b.add_argument("--runs", type=int, default=1)
    b.add_argument("--warmup", type=int, default=1)
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser("score", help="teacher-forced full-vocabulary log-probabilities")
    common(s)
    s.add_argument("--text-file", required=True)
    s.add_argument("--positions", type=int, required=True)
    s.add_argument("--out", required=True, help="where to write the (P, V) float32 .npy")
    s.set_defaults(func=cmd_score)
    sp = sub.add_parser(
        "spec", help="speculative decoding vs autoregressive: speed, acceptance, losslessness"
    )
    common(sp, model_required=False)
    options.add_random_weights(sp)
    drafters = sp.add_mutually_exclusive_group(required=True)
    drafters.add_argument("--draft", help="draft model (same tokenizer): registry name or GGUF path")
    drafters.add_argument("--ngram", type=int, help="n-gram prompt lookup with suffixes up to N tokens")
    sp.add_argument("--ctx", type=int, required=True, help="prompt tokens")
    sp.add_argument("--gen", type=int, default=64)
    sp.add_argument(
        "--block", type=int, default=DEFAULT_BLOCK, help="most tokens committed per target pass (B)"
    )
    sp.add_argument("--runs", type=int, default=3)
    sp.add_argument(
        "--invariant",
        action="store_true",
        help="row-invariant decode and verify (fixed-width blocks): bit-exact losslessness in bf16",
    )
    options.add_compile(sp)
    options.add_prompt_file(sp)
    options.add_sampling(sp)
    sp.set_defaults(func=cmd_spec)
    serve.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if getattr(args, "serve", False):
            return serve.serve(args)
        emit(args.func(args))
    except (ModelFileError, GGUFError, TokenizerError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
