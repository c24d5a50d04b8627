"""The HTTP relay: a trusted program the harness starts inside an engine's sandbox, in front of an engine that
serves HTTP (llama.cpp's `llama-server`, protocol `llama-server/1` in engine.yaml, or any server of
OpenAI-compatible completions that returns token ids, `openai-completions/1`), so that the harness speaks
`evalbot.serve/1` to it as to any engine (docs/protocol.md).

It starts the engine's own argv as its child (stdin closed, stdout sent to stderr, so the engine has no
handle on the protocol pipe), waits for its `/health`, prints the ready line and then turns each request line
into HTTP on the sandbox's private loopback, forwarding every streamed token the moment it arrives: the
harness timestamps the relay's lines, the freezer holds the relay and the engine as one tree, and the
cgroup's CPU clock counts both. Before the engine starts, the relay makes itself non-dumpable, so the
engine (same user, same sandbox) cannot ptrace it, read or write its memory, or reach its pipes through
/proc; the engine can only kill it, which fails its own side.

| evalbot.serve/1 | llama-server |
|---|---|
| `generate` | `POST /completion`, the prompt as token ids, greedy (`top_k` 1), `ignore_eos`, streamed with `return_tokens`; a token that ends inside a UTF-8 character gets no chunk (its id never streams): where the count (`tokens_predicted`) runs ahead of the ids, the rest wait for a replay of the request, which gives every id |
| `prefill`, then `generate` with `continue` | `POST /completion` with `n_predict` 0 and `cache_prompt`, then the prompt and the continuation token with `cache_prompt`, answered whole (its clock ends at its last token): only the new token is evaluated at decode time |
| `tokenize` | `POST /tokenize` (no special tokens), cut at `max_tokens` |
| `score` | one `POST /completion` a position (the prefix cached), `n_probs` = TOP_K: argmax, margin, top-1 and the logprob of the next id (`save`: a float32 [P, V] file with the TOP_K log-probs of each position and the rest of the mass spread evenly over the other ids) |

| evalbot.serve/1 | OpenAI-compatible completions (`openai-completions/1`) |
|---|---|
| `generate` | `POST /v1/completions`, the prompt as token ids, greedy (`temperature` 0, `top_k` 1), `ignore_eos`, streamed; each chunk's token ids from `choices[0].token_ids` (vLLM's `return_token_ids`), `logprobs.content[].id` (llama-server) or `logprobs.tokens` as `token_id:N` (vLLM's `return_tokens_as_token_ids`); a chunk with text and none of them fails the side |
| `tokenize` | `POST /tokenize` (vLLM's `prompt`, llama-server's `content`; no special tokens), cut at `max_tokens` |
| `score` | one `POST /v1/completions` a position, `max_tokens` 1 and `logprobs` = OPENAI_TOP_K, read as above |

No `prefill`: such an engine is timed on the one-part clock. Its vocabulary's size, which the API does not
give, comes from the harness (`--vocab`, read from the model file).

It imports nothing outside the standard library (it runs with `-I` from the harness's interpreter, whatever
the engine's toolchain) and nothing of evalbot.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import http.client
import json
import math
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

PROTOCOL = "llama-server/1"
OPENAI = "openai-completions/1"
OPS = ("generate", "prefill", "tokenize", "score", "shutdown")
OPENAI_OPS = ("generate", "tokenize", "score", "shutdown")
TOP_K = 64  # log-probs asked a position for `score` (llama-server's n_probs)
OPENAI_TOP_K = 20  # the most OpenAI's API gives (and vLLM's default max_logprobs)
TOKEN_ID = re.compile(r"token_id:(\d{1,9})")
HEALTH_POLL_S = 0.05
PR_SET_DUMPABLE = 4
SAVE_NAME = re.compile(r"[a-z0-9_-]{1,40}\.npy")
MAX_EVENT_BYTES = 1 << 20  # a streamed line longer than this is no llama-server chunk


class RequestError(ValueError):
    """A request the relay cannot turn into HTTP; its error line names the request's id."""


class EngineError(RuntimeError):
    """The engine's HTTP answer broke what llama-server promises (status, JSON, token ids)."""


def greedy_body(prompt: list[int], n_predict: int, stream: bool, cache_prompt: bool) -> dict[str, Any]:
    """A /completion body: the prompt as ids, greedy, at most n_predict tokens. Not `ignore_eos`: llama-server
    then biases every end-of-generation token to -inf, and its greedy tokens are no longer the model's
    (found judging llama.cpp: the decode audit saw <|im_start|> where the model's argmax is <|im_end|>).
    It stops at one instead, and the relay asks on from there. Pure."""
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "stream": stream,
        "return_tokens": True,
        "cache_prompt": cache_prompt,
        "id_slot": 0,
        "temperature": 0.0,
        "top_k": 1,
        "samplers": ["top_k"],
    }


def sse_events(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream (`data: {...}` lines), until `[DONE]` or its end;
    a line of MAX_EVENT_BYTES without its end is refused (read no further into the relay's memory)."""
    for raw in lines:
        if len(raw) >= MAX_EVENT_BYTES and not raw.endswith(b"\n"):
            raise EngineError(f"a streamed line runs past {MAX_EVENT_BYTES >> 20} MiB")
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise EngineError(f"a streamed chunk is not JSON: {data[:120]!r}") from exc
        if not isinstance(obj, dict):
            raise EngineError(f"a streamed chunk is not an object: {data[:120]!r}")
        if "error" in obj:
            raise EngineError(f"the engine answered an error: {str(obj['error'])[:200]}")
        yield obj


def chunk_tokens(obj: dict[str, Any]) -> list[Any]:
    """The tokens one streamed chunk carries (`tokens`, from return_tokens), passed on as the engine sent
    them: the harness checks every token line of every engine alike (an integer, below the vocab). Pure."""
    toks = obj.get("tokens", [])
    if not isinstance(toks, list):
        raise EngineError(f"a chunk's tokens are not a list: {str(toks)[:120]}")
    return toks


def position_score(probs: dict[str, Any], target: int) -> tuple[int, float, bool, float]:
    """argmax, margin (top-1 less top-2 logprob), top-1 and the target's logprob from one position's
    `completion_probabilities` entry; a target outside the top K gets the K-th logprob (an upper bound).
    Pure."""
    top = probs.get("top_logprobs")
    if not isinstance(top, list) or len(top) < 2:
        raise EngineError(f"a position came back without its top log-probs: {str(probs)[:160]}")
    ids = [int(t["id"]) for t in top]
    lps = [float(t["logprob"]) for t in top]
    lp = lps[ids.index(target)] if target in ids else lps[-1]
    return ids[0], lps[0] - lps[1], ids[0] == target, lp


def openai_body(
    model: str, prompt: list[int], max_tokens: int, stream: bool, logprobs: int
) -> dict[str, Any]:
    """A /v1/completions body: the prompt as ids, greedy, exactly max_tokens tokens, the token ids asked for
    in each server's way (unknown fields are ignored by both). Pure."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0.0,
        "top_k": 1,
        "ignore_eos": True,
        "logprobs": logprobs,
        "return_token_ids": True,  # vLLM: choices[0].token_ids
        "return_tokens_as_token_ids": True,  # vLLM: logprobs' tokens as "token_id:N"
    }


def _token_id(tok: Any) -> Any:
    """`token_id:N` as N; anything else as it came (the harness refuses what is no id)."""
    m = TOKEN_ID.fullmatch(tok) if isinstance(tok, str) else None
    return int(m.group(1)) if m else tok


def openai_choice(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A completion chunk's first choice (None for a chunk without one, such as usage). Pure."""
    choices = obj.get("choices")
    if choices is None or choices == []:
        return None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise EngineError(f"a completion's choices are not a list of objects: {str(choices)[:120]}")
    return choices[0]


def openai_tokens(obj: dict[str, Any]) -> list[Any]:
    """The token ids one streamed completion chunk carries, whichever way the server returns them; a chunk
    with text but no ids fails (the harness times token ids, never text). Pure."""
    c = openai_choice(obj)
    if c is None:
        return []
    if isinstance(c.get("token_ids"), list):
        return list(c["token_ids"])
    lp = c.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        return [e.get("id") if isinstance(e, dict) else e for e in lp["content"]]
    if isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
        return [_token_id(t) for t in lp["tokens"]]
    if c.get("text"):
        raise EngineError(
            "a completion chunk carries text but no token ids (ask the server for them: vLLM's "
            "return_token_ids or return_tokens_as_token_ids, llama-server's logprobs)"
        )
    return []


def openai_top(c: dict[str, Any]) -> list[tuple[int, float]]:
    """The first generated position's top log-probs as (id, logprob), best first, from either dialect:
    llama-server's `logprobs.content[0].top_logprobs` or the legacy `logprobs.top_logprobs[0]` keyed by
    `token_id:N`. Pure."""
    lp = c.get("logprobs")
    top: list[tuple[Any, Any]] = []
    if isinstance(lp, dict) and isinstance(lp.get("content"), list) and lp["content"]:
        first = lp["content"][0]
        entries = first.get("top_logprobs") if isinstance(first, dict) else None
        top = [(e.get("id"), e.get("logprob")) for e in entries or [] if isinstance(e, dict)]
    elif isinstance(lp, dict) and isinstance(lp.get("top_logprobs"), list) and lp["top_logprobs"]:
        first = lp["top_logprobs"][0]
        top = [(_token_id(k), v) for k, v in first.items()] if isinstance(first, dict) else []
    try:
        out = [(int(i), float(v)) for i, v in top if not isinstance(i, bool)]
    except (TypeError, ValueError) as exc:
        raise EngineError(f"top log-probs that are not (token id, logprob): {str(top)[:160]}") from exc
    if len(out) < 2 or len(out) != len(top):
        raise EngineError(f"a position came back without its top log-probs as token ids: {str(lp)[:160]}")
    return sorted(out, key=lambda t: -t[1])


def dense_row(top: list[tuple[int, float]], vocab: int) -> array.array[float]:
    """A position's log-probs over the whole vocabulary (float32) from its top K: the K as given, the rest
    of the mass spread evenly over the other ids (a floor well under the K-th where the K hold nearly all).
    Pure."""
    mass = sum(math.exp(lp) for _, lp in top)
    rest = max(1.0 - mass, 1e-12) / max(vocab - len(top), 1)
    row = array.array("f", [math.log(rest)]) * vocab
    for i, lp in top:
        row[i] = lp
    return row


def write_npy(path: Path, rows: list[array.array[float]], vocab: int) -> None:
    """A little-endian float32 .npy of shape [P, V] (format 1.0), written without numpy."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({len(rows)}, {vocab}), }}"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with path.open("wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        for row in rows:
            if sys.byteorder != "little":
                row = array.array("f", row)
                row.byteswap()
            f.write(row.tobytes())


class Relay:
    """One llama-server behind HTTP; `answer` turns a request into protocol lines on `out`."""

    health = "/health"  # polled until it answers 200

    def __init__(self, port: int, out: Any):
        self.port = port
        self.out = out
        self.conn: http.client.HTTPConnection | None = None  # the last request's, closed by the next
        self.vocab = 0
        self.prefilled: list[int] | None = None

    def emit(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.out.flush()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        # a connection a request: the server may close one after a stream, and a loopback connect is
        # tens of microseconds, the same for both sides
        if self.conn is not None:
            self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=None)
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        if resp.status != 200:
            text = resp.read()[:300]
            raise EngineError(f"{method} {path}: HTTP {resp.status}: {text!r}")
        return resp

    def json_call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        raw = self.call(method, path, body).read(MAX_EVENT_BYTES * 16 + 1)
        if len(raw) > MAX_EVENT_BYTES * 16:
            raise EngineError(f"{method} {path}: an answer past {MAX_EVENT_BYTES * 16 >> 20} MiB")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise EngineError(f"{method} {path}: not JSON: {raw[:120]!r}") from exc

    def wait_ready(self, child: subprocess.Popen[bytes]) -> None:
        """Poll /health until it answers 200 (the harness bounds how long); the child's exit ends it."""
        while True:
            if child.poll() is not None:
                raise SystemExit(
                    f"relay: the engine exited with status {child.returncode} before it was ready"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", self.health)
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(HEALTH_POLL_S)

    def ready(self) -> None:
        models = self.json_call("GET", "/v1/models")
        try:
            meta = models["data"][0]["meta"]
            vocab = int(meta["n_vocab"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise SystemExit(f"relay: /v1/models named no n_vocab: {str(models)[:200]}") from exc
        self.vocab = vocab
        props = self.json_call("GET", "/props")
        ident = {
            k: props.get(k) for k in ("build_info", "model_path", "total_slots") if isinstance(props, dict)
        }
        self.emit(
            {
                "event": "ready",
                "protocol": PROTOCOL,
                "config": {"vocab_size": vocab, "n_ctx": meta.get("n_ctx_train")},
                "ops": list(OPS[:-1]),
                "engine": ident,
                "relay": "evalbot http_relay",
            }
        )

    # ------------------------------------------------------------------ ops
    def ids(self, req: dict[str, Any], field: str, minimum: int = 1) -> list[int]:
        v = req.get(field)
        if not isinstance(v, list) or len(v) < minimum:
            raise RequestError(f"{field}: expected a list of at least {minimum} token ids")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab for t in v):
            raise RequestError(f"{field}: every id must be an integer in [0, {self.vocab})")
        return v

    def tokenize_body(self, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": False}

    def tokenize(self, rid: str, req: dict[str, Any]) -> None:
        """POST /tokenize (no special tokens), the ids cut at max_tokens."""
        text, cap = req.get("text"), req.get("max_tokens")
        if not isinstance(text, str) or not isinstance(cap, int) or cap < 1:
            raise RequestError("tokenize: expected text (a string) and max_tokens (a positive integer)")
        got = self.json_call("POST", "/tokenize", self.tokenize_body(text))
        toks = got.get("tokens") if isinstance(got, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            raise EngineError(f"/tokenize gave no token ids: {str(got)[:160]}")
        self.emit({"id": rid, "event": "done", "ids": toks[:cap]})

    def generate_args(self, req: dict[str, Any]) -> tuple[list[int], int]:
        """A generate's prompt ids and max_new, checked."""
        ids = self.ids(req, "prompt_ids")
        max_new = req.get("max_new")
        if not isinstance(max_new, int) or isinstance(max_new, bool) or not 1 <= max_new <= 1 << 16:
            raise RequestError("max_new: expected an integer from 1")
        return ids, max_new

    def score_args(self, req: dict[str, Any]) -> tuple[list[int], int, str | None]:
        """A score's ids, the first position it scores and the file it saves to, checked."""
        ids = self.ids(req, "ids", 2)
        start = req.get("from")
        if not isinstance(start, int) or not 1 <= start < len(ids):
            raise RequestError(f"from: expected an integer in [1, {len(ids)})")
        save = req.get("save")
        if save is not None and (not isinstance(save, str) or not SAVE_NAME.fullmatch(save)):
            raise RequestError("save: expected a file name like head.npy")
        return ids, start, save

    def answer(self, req: dict[str, Any]) -> None:
        rid, op = req["id"], req.get("op")
        prefilled, self.prefilled = self.prefilled, None  # any request drops a prefilled prompt
        if op == "prefill":
            prompt = self.ids(req, "prompt_ids")
            self.json_call("POST", "/completion", greedy_body(prompt, 0, False, True))
            self.prefilled = prompt
            self.emit({"id": rid, "event": "done", "n": 0})
        elif op == "generate":
            self.generate(rid, req, prefilled)
        elif op == "tokenize":
            self.tokenize(rid, req)
        elif op == "score":
            self.score(rid, req)
        else:
            raise RequestError(f"unknown op {op!r}; this relay answers {', '.join(OPS)}")

    def generate(self, rid: str, req: dict[str, Any], prefilled: list[int] | None) -> None:
        ids, max_new = self.generate_args(req)
        ends = req.get("stream") == "ends"
        if req.get("continue"):
            if prefilled is None:
                raise RequestError("continue: no prefilled prompt (prefill must come just before)")
            prompt, cached = prefilled + ids, True
        else:
            prompt, cached = ids, False
        if cached:  # the continuation: timed from its sending to its last token, so it needs no stream
            self.emit_tokens(rid, ends, [], self.replay(prompt, max_new))
            return

        def chunks() -> Iterator[tuple[list[Any], Any]]:
            done: list[Any] = []  # the ids of the requests before this one, each ended by an EOG token
            while len(done) < max_new:
                body = greedy_body(prompt + done, max_new - len(done), True, bool(done))
                resp = self.call("POST", "/completion", body)
                here: list[Any] = []
                final: dict[str, Any] = {}
                for obj in sse_events(iter(partial(resp.readline, MAX_EVENT_BYTES), b"")):
                    toks = chunk_tokens(obj)
                    here += toks
                    counted = obj.get("tokens_predicted")
                    yield (
                        toks,
                        len(done) + counted
                        if isinstance(counted, int) and not isinstance(counted, bool)
                        else None,
                    )
                    if obj.get("stop"):
                        final = obj
                        break
                resp.read()
                if final.get("stop_type") != "eos" or not here or final.get("tokens_predicted") != len(here):
                    return  # done, or short of ids (the replay gives them)
                done += here

        self.stream_tokens(rid, ends, chunks(), lambda: self.replay(prompt, max_new))

    def replay(self, prompt: list[int], max_new: int) -> list[Any]:
        """The whole greedy answer at once (the prompt cached), asked on after each end-of-generation token:
        every token's id, those the stream withheld too."""
        out: list[Any] = []
        while len(out) < max_new:
            got = self.json_call(
                "POST", "/completion", greedy_body(prompt + out, max_new - len(out), False, True)
            )
            toks = got.get("tokens") if isinstance(got, dict) else None
            if not isinstance(toks, list):
                raise EngineError(f"/completion gave no tokens: {str(got)[:160]}")
            out += toks
            if got.get("stop_type") != "eos" or not toks:
                break
        return out

    def stream_tokens(
        self, rid: str, ends: bool, chunks: Iterator[tuple[list[Any], Any]], replay: Any
    ) -> None:
        """Each chunk's ids forwarded the moment it arrives, until a chunk counts more tokens predicted than
        ids seen: llama-server sends no chunk for a token that ends inside a UTF-8 character, so its id
        never comes. From there the rest waits, and a replay of the request (greedy, its prompt cached) gives
        every id; the ones already sent must be its first."""
        sent: list[Any] = []  # on their own lines, as they came
        later: list[Any] = []  # the rest, sent at the end
        gap = False
        for toks, predicted in chunks:
            # a count ahead of the ids seen with this chunk's: a token before them was never sent
            counted = isinstance(predicted, int) and not isinstance(predicted, bool)
            gap = gap or (counted and predicted > len(sent) + len(later) + len(toks))
            for t in toks:
                if gap or (ends and sent):
                    later.append(t)
                else:
                    self.emit({"id": rid, "tok": t})
                    sent.append(t)
        if gap:
            full = replay()
            if full[: len(sent)] != sent:
                raise EngineError(
                    f"a replay of the request disagrees with its stream: {str(full)[:80]} against {str(sent)[:80]}"
                )
            later = full[len(sent) :]
        self.emit_tokens(rid, ends, sent, later)

    def emit_tokens(self, rid: str, ends: bool, sent: list[Any], later: list[Any]) -> None:
        """The tokens not yet sent (one a line, or the first on its own and the rest in one line with stream
        'ends'), then the summary."""
        for t in later if not ends else later[:1] if not sent else []:
            self.emit({"id": rid, "tok": t})
        rest = later[1:] if ends and not sent else later if ends else []
        if rest:
            self.emit({"id": rid, "toks": rest})
        self.emit({"id": rid, "event": "done", "n": len(sent) + len(later)})

    def score(self, rid: str, req: dict[str, Any]) -> None:
        ids, start, save = self.score_args(req)
        out: dict[str, list[Any]] = {"argmax": [], "margin": [], "top1": [], "logprob": []}
        rows: list[array.array[float]] = []
        for i in range(start - 1, len(ids) - 1):
            body = greedy_body(ids[: i + 1], 1, False, True) | {
                "n_probs": TOP_K,
                "post_sampling_probs": False,
            }
            got = self.json_call("POST", "/completion", body)
            probs = got.get("completion_probabilities") if isinstance(got, dict) else None
            if not isinstance(probs, list) or not probs:
                raise EngineError(f"position {i}: no completion_probabilities")
            am, margin, top1, lp = position_score(probs[0], ids[i + 1])
            for k, v in zip(out, (am, margin, top1, lp), strict=True):
                out[k].append(v)
            if save:
                top = [(int(t["id"]), float(t["logprob"])) for t in probs[0]["top_logprobs"]]
                rows.append(dense_row(top, self.vocab))
        if save:
            write_npy(Path(save), rows, self.vocab)
        self.emit({"id": rid, "event": "done", **out})


class OpenAIRelay(Relay):
    """A server of OpenAI-compatible completions that returns token ids (vLLM, SGLang, llama-server's
    /v1/completions): no prefill, so the harness times each request in one part."""

    health = "/v1/models"

    def __init__(self, port: int, out: Any, vocab: int):
        super().__init__(port, out)
        self.vocab = vocab
        self.model = ""

    def ready(self) -> None:
        models = self.json_call("GET", "/v1/models")
        try:
            first = models["data"][0]
            self.model = str(first["id"])
        except (KeyError, IndexError, TypeError) as exc:
            raise SystemExit(f"relay: /v1/models named no model: {str(models)[:200]}") from exc
        self.emit(
            {
                "event": "ready",
                "protocol": OPENAI,
                "config": {"vocab_size": self.vocab, "max_model_len": first.get("max_model_len")},
                "ops": list(OPENAI_OPS[:-1]),
                "engine": {"model": self.model, "owned_by": first.get("owned_by")},
                "relay": "evalbot http_relay",
            }
        )

    def tokenize_body(self, text: str) -> dict[str, Any]:
        """vLLM's fields and llama-server's (each ignores the other's)."""
        return {"model": self.model, "prompt": text, "add_special_tokens": False, "content": text,
                "add_special": False}  # fmt: skip

    def answer(self, req: dict[str, Any]) -> None:
        rid, op = req["id"], req.get("op")
        if op == "generate":
            self.generate(rid, req, None)
        elif op == "tokenize":
            self.tokenize(rid, req)
        elif op == "score":
            self.score(rid, req)
        else:
            raise RequestError(f"unknown op {op!r}; this relay answers {', '.join(OPENAI_OPS)}")

    def generate(self, rid: str, req: dict[str, Any], prefilled: list[int] | None) -> None:
        ids, max_new = self.generate_args(req)
        if req.get("continue"):
            raise RequestError("continue: this engine answers no prefill")
        ends = req.get("stream") == "ends"
        body = openai_body(self.model, ids, max_new, True, 1) | {"stream_options": {"include_usage": True}}
        resp = self.call("POST", "/v1/completions", body)

        def chunks() -> Iterator[tuple[list[Any], Any]]:
            for obj in sse_events(iter(lambda: resp.readline(MAX_EVENT_BYTES), b"")):
                usage = obj.get("usage")
                yield openai_tokens(obj), usage.get("completion_tokens") if isinstance(usage, dict) else None

        self.stream_tokens(rid, ends, chunks(), lambda: self.replay(ids, max_new))
        resp.read()

    def replay(self, prompt: list[int], max_new: int) -> list[Any]:
        got = self.json_call("POST", "/v1/completions", openai_body(self.model, prompt, max_new, False, 1))
        toks = openai_tokens(got) if isinstance(got, dict) else []
        if len(toks) < max_new:
            raise EngineError(
                f"{len(toks)} token ids of {max_new}, streamed or not; a llama-server is llama-server/1 (its "
                "/v1/completions never gives a token that ends inside a UTF-8 character)"
            )
        return toks

    def score(self, rid: str, req: dict[str, Any]) -> None:
        ids, start, save = self.score_args(req)
        out: dict[str, list[Any]] = {"argmax": [], "margin": [], "top1": [], "logprob": []}
        rows: list[array.array[float]] = []
        for i in range(start - 1, len(ids) - 1):
            got = self.json_call(
                "POST", "/v1/completions", openai_body(self.model, ids[: i + 1], 1, False, OPENAI_TOP_K)
            )
            c = openai_choice(got) if isinstance(got, dict) else None
            if c is None:
                raise EngineError(f"position {i}: a completion without choices: {str(got)[:160]}")
            top = openai_top(c)
            probs = {"top_logprobs": [{"id": t, "logprob": lp} for t, lp in top]}
            am, margin, top1, lp = position_score(probs, ids[i + 1])
            for k, v in zip(out, (am, margin, top1, lp), strict=True):
                out[k].append(v)
            if save:
                rows.append(dense_row(top, self.vocab))
        if save:
            write_npy(Path(save), rows, self.vocab)
        self.emit({"id": rid, "event": "done", **out})


def make_undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): no process of the same user may ptrace this one or open its /proc files."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit(f"relay: prctl(PR_SET_DUMPABLE) failed: errno {ctypes.get_errno()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="evalbot.serve/1 in front of an engine's HTTP server")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--protocol", choices=(PROTOCOL, OPENAI), default=PROTOCOL)
    ap.add_argument("--vocab", type=int, default=0, help="the model's vocabulary size (openai-completions/1)")
    ap.add_argument("engine", nargs=argparse.REMAINDER, help="-- then the engine's argv")
    args = ap.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not engine:
        ap.error("the engine's argv is missing")
    if args.protocol == OPENAI and args.vocab < 2:
        ap.error("--vocab: an OpenAI-compatible server does not say its vocabulary's size; give it")
    make_undumpable()
    out = sys.stdout
    child = subprocess.Popen(engine, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), close_fds=True)
    relay = OpenAIRelay(args.port, out, args.vocab) if args.protocol == OPENAI else Relay(args.port, out)
    try:
        relay.wait_ready(child)
        relay.ready()
        for line in sys.stdin:
            try:
                req = json.loads(line)
            except ValueError:
                relay.emit({"event": "error", "message": f"a request line is not JSON: {line[:80]!r}"})
                continue
            if not isinstance(req, dict):
                relay.emit({"event": "error", "message": "a request must be a JSON object"})
                continue
            if req.get("op") == "shutdown":
                break
            rid = req.get("id")
            if not isinstance(rid, str) or not 1 <= len(rid) <= 64:
                relay.emit({"event": "error", "message": "id: expected a string of 1-64 characters"})
                continue
            try:
                relay.answer(req)
            except RequestError as exc:
                relay.emit({"id": rid, "event": "error", "message": str(exc)})
            except (EngineError, OSError, http.client.HTTPException) as exc:
                # the engine broke its server's contract: say so on stderr and end, failing its side
                print(f"relay: request {rid}: {exc}", file=sys.stderr, flush=True)
                return 3
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
