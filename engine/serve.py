"""`python -m engine serve`: load once, then answer JSON-lines requests on stdin, one line per token.

A harness file: the bot measures engines through it, and holds the clock itself. The engine streams
every generated token as soon as it has it (one flushed line each); the bot timestamps the lines as
they arrive. The engine's own timings travel in each request's summary line as diagnostics only.

Protocol ``evalbot.serve/1`` (one JSON object per line, both ways):

    -> {"id": "r1", "op": "generate", "prompt_ids": [..], "max_new": 32,
        "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    <- {"id": "r1", "tok": 1234}                        one line per generated token
    <- {"id": "r1", "event": "done", "n": 32, "stop": "length", "timings": {...}}

    With "stream": "ends" (greedy, no stop ids) the first token comes as soon as the prefill has it, and
    the other tokens in one line when the last is decoded: no per-token write, flush or host sync while
    the harness's clock runs (decode is still first line to last).
    <- {"id": "r1", "tok": 1234}
    <- {"id": "r1", "toks": [..]}                       the remaining max_new - 1 tokens
    <- {"id": "r1", "event": "done", ...}

    The prompt in two parts, so that no decode step can be computed before the harness's decode clock
    starts: a prefill that answers no token, then a generate that continues it. Its first decoded token
    depends on the continuation's ids, which the harness draws only once the prefill has answered.
    -> {"id": "r5", "op": "prefill", "prompt_ids": [..]}
    <- {"id": "r5", "event": "done", "n": 4096, "timings": {"prefill_s": ..}}
    -> {"id": "r6", "op": "generate", "continue": true, "prompt_ids": [t], "max_new": 128, "stream": "ends"}
    <- (as any generate: the prompt is the prefilled one followed by [t]; any other request in between
       drops the prefilled prompt, and a continue with none held is an error)

    -> {"id": "r2", "op": "spec", "prompt_ids": [..], "max_new": 64, "drafter": "ngram", "ngram": 3, "block": 7}
    <- {"id": "r2", "toks": [..]}                       one line per verify step (the first: the prefill's token)
    <- {"id": "r2", "event": "done", "n": 64, "steps": 20, "timings": {...}}

    -> {"id": "r4", "op": "tokenize", "text": "...", "max_tokens": 512}
    <- {"id": "r4", "event": "done", "ids": [..]}

    -> {"id": "r3", "op": "score", "ids": [..], "from": 128}
    <- {"id": "r3", "event": "done", "argmax": [..], "margin": [..], "top1": [..], "logprob": [..]}
       (teacher-forced: position i predicts ids[i + 1], for i from `from` - 1 to len(ids) - 2; with
       "save": "head.npy" every position's full log-probabilities are also written there, float32 [P, V])

    -> {"op": "shutdown"}

At start the engine loads, warms up (compile, caches), and prints ``{"event": "ready", ...}`` with its
identity, its config and the ops it answers (``"ops"``: the harness times the prompt in two parts where
main's engine lists ``prefill``). A malformed request gets ``{"id": .., "event": "error", "message": ..}`` and the
engine goes on with the next one. Anything else the engine's code prints goes to stderr: stdout carries
protocol lines only.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
import time
from typing import IO, Any

import numpy as np
import torch

from engine import generate as gen
from engine import ops, options
from engine import speculative as spec
from engine.model import TUNINGS
from engine.sampling import SamplingParams
from engine.shapes import SHAPES

PROTOCOL = "evalbot.serve/1"
SAVE_NAME = re.compile(r"[a-z0-9_-]{1,40}\.npy")
MAX_REQUEST_BYTES = 4 << 20
MAX_ID_CHARS = 64
OPS = ("generate", "prefill", "spec", "score", "tokenize", "shutdown")
STREAMS = ("token", "ends")


class RequestError(ValueError):
    """A request that does not follow the protocol; the message says which field and why, and `rid` is
    the request's id where it has a readable one (its error line then names it)."""

    def __init__(self, message: str, rid: str | None = None):
        super().__init__(message)
        self.rid = rid


def _ints(value: Any, field: str, vocab: int, minimum: int = 1) -> list[int]:
    if not isinstance(value, list) or len(value) < minimum:
        raise RequestError(f"{field}: expected a list of at least {minimum} token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in value):
        raise RequestError(f"{field}: every id must be an integer in [0, {vocab})")
    return value


def _int(req: dict[str, Any], field: str, default: int | None, lo: int, hi: int) -> int:
    value = req.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise RequestError(f"{field}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def _float(req: dict[str, Any], field: str, default: float, lo: float, hi: float) -> float:
    value = req.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise RequestError(f"{field}: expected a number in [{lo}, {hi}], got {value!r}")
    return float(value)


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line as a checked dict (op and id); RequestError otherwise."""
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestError(f"request of {len(line)} bytes exceeds {MAX_REQUEST_BYTES}")
    try:
        req = json.loads(line)
    except ValueError as exc:
        raise RequestError(f"not JSON: {exc}") from None
    if not isinstance(req, dict):
        raise RequestError("a request is a JSON object")
    op = req.get("op")
    if op == "shutdown":
        return req
    rid = req.get("id", "")
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID_CHARS:
        raise RequestError(f"id: expected a string of 1-{MAX_ID_CHARS} characters, got {rid!r}")
    if op not in OPS:
        raise RequestError(f"op: expected one of {', '.join(OPS)}, got {op!r}", rid)
    return req


class Server:
    """One loaded model answering requests; `out` is the protocol stream (stdout's original fd)."""

    def __init__(self, lm: gen.LoadedModel, max_seq: int, out: IO[str], draft: gen.LoadedModel | None = None):
        self.lm, self.out, self.max_seq = lm, out, max_seq
        self.session = gen.Session(lm, max_seq=max_seq)
        self.draft = gen.Session(draft, max_seq=max_seq) if draft is not None else None
        self.held = False  # a prefilled prompt waits for its continuation
        self._ops: list[str] | None = None

    def ops(self) -> list[str]:
        """The ops this engine answers, for its ready line: `prefill` only where the engine's Session can
        prefill and continue (an engine package older than the two-part request serves one part, and the
        harness sees that in the ready line instead of a crash at the first prefill)."""
        if self._ops is None:
            params = inspect.signature(self.session.generate).parameters
            two = callable(getattr(self.session, "prefill", None)) and "resume" in params
            self._ops = [op for op in OPS if op != "shutdown" and (two or op != "prefill")]
        return self._ops

    def _held(self) -> bool:
        """Whether a prefilled prompt waits, and from now on not: one continuation per prefill."""
        held, self.held = self.held, False
        return held

    def send(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n")
        self.out.flush()

    def done(self, rid: str, **summary: Any) -> None:
        """A request's last line: its summary."""
        self.send({"id": rid, "event": "done", **summary})

    def handle(self, req: dict[str, Any]) -> None:
        op, rid = req["op"], req["id"]
        vocab = self.lm.cfg.vocab_size
        held = self._held()
        if op not in self.ops() and op != "shutdown":
            raise RequestError(
                f"op: {op!r} is not one this engine answers (its ready line lists {self.ops()})"
            )
        if op == "prefill":
            prompt = _ints(req.get("prompt_ids"), "prompt_ids", vocab)
            if len(prompt) >= self.max_seq:
                raise RequestError(
                    f"prompt_ids: {len(prompt)} tokens leave no room in {self.max_seq} positions"
                )
            seconds = self.session.prefill(prompt)
            self.held = True
            self.done(rid, n=len(prompt), timings={"prefill_s": seconds})
        elif op == "generate":
            resume = req.get("continue", False)
            if resume not in (True, False):
                raise RequestError(f"continue: expected true or false, got {resume!r}")
            if resume and not held:
                raise RequestError("continue: no prefilled prompt waits (a prefill, then one continuation)")
            prompt = _ints(req.get("prompt_ids"), "prompt_ids", vocab)
            start = self.session.length if resume else 0
            max_new = _int(req, "max_new", None, 1, self.max_seq - start - len(prompt))
            params = SamplingParams(
                _float(req, "temperature", 0.0, 0.0, 100.0),
                _int(req, "top_k", 0, 0, vocab),
                _float(req, "top_p", 1.0, 0.0, 1.0),
                _int(req, "seed", 0, 0, 2**63 - 1),
            )
            mode = req.get("stream", "token")
            if mode not in STREAMS:
                raise RequestError(f"stream: expected one of {', '.join(STREAMS)}, got {mode!r}")
            if mode == "ends" and not params.greedy:
                raise RequestError("stream 'ends' is for greedy requests (temperature 0)")
            sent: list[int] = []

            def on_token(t: int) -> None:
                if mode == "token" or not sent:  # ends: the first token at once, the rest after the last
                    self.send({"id": rid, "tok": t})
                    sent.append(t)

            stream = mode == "token"
            if resume:
                out = self.session.generate(
                    prompt, max_new, params, on_token=on_token, stream=stream, resume=True
                )
            else:  # without the keyword: an engine whose generate predates `resume` still serves one part
                out = self.session.generate(prompt, max_new, params, on_token=on_token, stream=stream)
            if mode == "ends":
                if out.token_ids[: len(sent)] != sent:
                    raise RequestError("the engine returned other tokens than it streamed")
                if out.token_ids[len(sent) :]:
                    self.send({"id": rid, "toks": out.token_ids[len(sent) :]})
            self.done(rid, n=len(out.token_ids), stop=out.stop_reason, timings=_timings(out))
        elif op == "spec":
            prompt = _ints(req.get("prompt_ids"), "prompt_ids", vocab)
            block = _int(req, "block", spec.DEFAULT_BLOCK, 1, 64)
            max_new = _int(req, "max_new", None, 1, self.max_seq - len(prompt) - block)
            drafter: spec.Drafter
            if req.get("drafter", "ngram") == "draft":
                if self.draft is None:
                    raise RequestError("drafter 'draft': the engine was started without --draft")
                drafter = spec.DraftModelDrafter(self.draft)
            else:
                drafter = spec.NgramDrafter(_int(req, "ngram", 3, 1, 16))
            spec_out = spec.speculative_generate(
                self.session,
                drafter,
                prompt,
                max_new,
                block,
                SamplingParams(),
                on_step=lambda step: self.send({"id": rid, "toks": list(step)}),
            )
            self.done(rid, n=len(spec_out.token_ids), steps=spec_out.steps, timings=_timings(spec_out))
        elif op == "tokenize":
            text = req.get("text")
            if not isinstance(text, str) or self.lm.tokenizer is None:
                raise RequestError("tokenize: needs a 'text' string and a model with a tokenizer")
            limit = _int(req, "max_tokens", self.max_seq, 1, 1 << 20)
            self.done(rid, ids=self.lm.tokenizer.encode(text, add_bos=False)[:limit])
        elif op == "score":
            ids = _ints(req.get("ids"), "ids", vocab, minimum=2)
            start = _int(req, "from", 1, 1, len(ids) - 1)
            if len(ids) > self.max_seq:
                raise RequestError(f"ids: {len(ids)} tokens exceed the engine's {self.max_seq} positions")
            save = req.get("save")
            if save is not None:
                if not isinstance(save, str) or not SAVE_NAME.fullmatch(save):
                    raise RequestError("save: expected a plain file name such as head.npy")
                full = self.session.score(ids)  # [len(ids) - 1, V]
                with open(save, "wb") as f:  # in the working directory: the sandbox's scratch
                    np.save(f, full.cpu().numpy().astype(np.float32))
                logprobs = full[start - 1 :]
            else:
                logprobs = self.session.score(
                    ids, start
                )  # [len(ids) - start, V], row i predicts ids[start + i]
            top2 = logprobs.topk(2, dim=-1).values
            targets = torch.tensor(ids[start:], device=logprobs.device)
            self.done(
                rid,
                argmax=logprobs.argmax(-1).tolist(),
                margin=(top2[:, 0] - top2[:, 1]).tolist(),
                top1=top2[:, 0].tolist(),
                logprob=logprobs.gather(1, targets[:, None])[:, 0].tolist(),
            )


def _timings(out: gen.Generation | spec.SpecGeneration) -> dict[str, float]:
    """A generation's own timings, as its summary line reports them."""
    return {"prefill_s": out.prefill_s, "decode_s": out.decode_s}


def _load(args: argparse.Namespace) -> gen.LoadedModel:
    if args.random_weights:
        if not args.shape:
            raise ValueError("--random-weights needs --shape (one of: " + ", ".join(sorted(SHAPES)) + ")")
        return gen.load_random(args.shape, args.device, seed=args.seed, max_pos=args.max_seq)
    if not args.model:
        raise ValueError("serve needs --model, or --random-weights --shape NAME")
    return gen.load(args.model, args.device)


def _protocol_stream() -> IO[str]:
    """stdout's file, kept for protocol lines only; fd 1 and sys.stdout then point at stderr, so that
    a stray print anywhere in the engine cannot corrupt the protocol."""
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(args: argparse.Namespace, stdin: IO[bytes] | None = None, out: IO[str] | None = None) -> int:
    """Load, warm up, say ready, then answer requests until shutdown or end of input."""
    out = out or _protocol_stream()
    t0 = time.perf_counter()
    lm = _load(args)
    draft = gen.load(args.draft, args.device) if args.draft else None
    if lm.device.type == "cuda" and args.pack:
        lm.transformer.pack()
    compiled = lm.device.type == "cuda" if args.compile is None else args.compile
    if compiled:
        lm.transformer.compile(args.tuning)
    server = Server(lm, args.max_seq, out, draft)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = [i % lm.cfg.vocab_size for i in range(7, 7 + min(64, args.max_seq - 8))]
    for _ in range(args.warmup):
        server.session.generate(warm, 4)
    warmup_s = time.perf_counter() - t0
    server.send(
        {
            "event": "ready",
            "protocol": PROTOCOL,
            "engine": "evalbot-engine",
            "model_sha256": lm.sha256,
            "device": str(lm.device),
            "pid": os.getpid(),
            "config": {
                "arch": lm.cfg.arch,
                "dtype": str(lm.dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(),
                "max_seq": args.max_seq,
                "compile": compiled,
                "compiled_with": lm.transformer.compiled_with,
                "packed_weights": lm.device.type == "cuda" and args.pack,
                "cuda_graph": server.session.graph is not None,
                "random_weights": lm.random_weights,
                "vocab_size": lm.cfg.vocab_size,
                "decode_attention": ops.decode_config(
                    lm.cfg.n_head,
                    server.session.cache,
                    lm.transformer.blocks[0].decode_splits,
                    lm.transformer.blocks[0].decode_kernel,
                ),
            },
            "ops": server.ops(),
            "timings": {"load_s": load_s, "warmup_s": warmup_s},
        }
    )
    stream = stdin or sys.stdin.buffer
    while True:
        line = stream.readline(MAX_REQUEST_BYTES + 1)
        if not line:
            return 0
        if not line.strip():
            continue
        rid = None
        try:
            req = parse_request(line)
            rid = req.get("id")
            if req["op"] == "shutdown":
                return 0
            server.handle(req)
        except (RequestError, ValueError) as exc:
            rid = rid if rid is not None else getattr(exc, "rid", None)
            server.send({"id": rid, "event": "error", "message": str(exc)[:2000]})


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `serve` subcommand of `python -m engine`."""
    p = sub.add_parser("serve", help="load once, then answer JSON-lines requests on stdin (evalbot.serve/1)")
    p.add_argument("--model", help="GGUF path, or the name of a model evalbot fetched")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    options.add_random_weights(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft", help="a draft model for spec requests with drafter 'draft'")
    p.add_argument("--max-seq", type=int, required=True, help="the longest prompt + generation to serve")
    p.add_argument("--warmup", type=int, default=2, help="warm-up generations before 'ready'")
    options.add_compile(p)
    p.add_argument(
        "--tuning",
        choices=TUNINGS,
        default="pinned",
        help="pinned: nothing chosen by timing at load (one Inductor config per kernel, the decode kernel "
        "from a table); measured: Inductor autotunes and the decode kernels are timed (an experiment)",
    )
    p.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="CUDA: every weight in one allocation at fixed aligned offsets (an experiment: on the H200 it "
        "left the spread between placements as it was, docs/benchmarks.md)",
    )
    p.set_defaults(func=None, serve=True)
