"""The llama.cpp reference as a library (through llama-cpp-python): open a pinned portable build, score,
greedy-generate, audit and bench token ids, with the score and audit caches.

`python -m evalbot.reference` is its command line. Scores are deterministic and cached under ``$EVALBOT_CACHE/reference``
(else ``~/.cache/evalbot/reference``), keyed by the model's sha256, the reference build's identity (version,
pinned flags, sha256 of its libraries: ``evalbot.reference.build``), the flash-attention setting and the token
ids. A llama.cpp that is not the pinned portable build (a native one, with AVX-512 or AMX compiled in) is
refused with the reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evalbot.reference import build as reference_build
from evalbot.reference.registry import cache_dir, model_sha256

ENGINE_NAME = "llama.cpp"
FLASH_ATTN = False  # llama-cpp-python's default; the CLI's "auto" differs by ~4e-4 nats, so it is pinned
CTX_ALIGN = 256  # the C side rounds n_ctx up to this; the Python buffers do not, so ask for a multiple
_ROW_CHUNK = 16  # rows per float64 block when normalizing: 16 x 151936 x 8 B is about 19 MB
_KEY_SCHEMA = "evalbot.reference.score/2"
_INSTALL_HINT = (
    "llama-cpp-python is not installed; build and install the pinned portable reference with: "
    "python -m evalbot.reference.build install (from source: 5-25 minutes on 2 cores, cached after)"
)


class ReferenceFailure(RuntimeError):
    """The reference cannot run: llama-cpp-python is missing, or the input does not fit the request."""


@dataclass
class ScoreResult:
    """Reference log-probabilities for ids[:-1] predicting ids[1:], with how they were obtained."""

    logprobs: np.ndarray
    ids: list[int]
    config: dict[str, Any]
    timings: dict[str, float]
    cached: bool
    cache_key: str
    computed_timings: dict[str, float] = field(default_factory=dict)


def llama_cpp_module() -> Any:
    """The llama_cpp module, or ReferenceFailure saying how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ReferenceFailure(_INSTALL_HINT) from exc
    return llama_cpp


@functools.cache
def build_identity() -> dict[str, Any]:
    """The installed reference's identity; ReferenceFailure when it is not the pinned portable build."""
    ident = reference_build.identity(llama_cpp_module())
    problems = reference_build.portability_problems(ident)
    if problems:
        raise ReferenceFailure(
            "the installed llama.cpp is not the pinned portable reference build: "
            + "; ".join(problems)
            + ". Rebuild it with: python -m evalbot.reference.build install"
        )
    return ident


def default_threads() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def aligned_ctx(n_tokens: int) -> int:
    """The smallest multiple of 256 holding n_tokens (at least 256)."""
    return max(CTX_ALIGN, -(-n_tokens // CTX_ALIGN) * CTX_ALIGN)


def reference_cache_dir() -> Path:
    """Where cached reference scores live: next to the model cache."""
    return cache_dir().parent / "reference"


def cache_key(model_sha: str, build: dict[str, Any], flash_attn: bool, ids: list[int]) -> str:
    """The sha256 naming a cached score: everything that changes the log-probs, the build's identity too."""
    blob = json.dumps(
        {
            "schema": _KEY_SCHEMA,
            "model_sha256": model_sha,
            "llama_cpp": build.get("llama_cpp_python"),
            "cmake_args": build.get("cmake_args"),
            "lib_sha256": build.get("lib_sha256"),
            "flash_attn": flash_attn,
            "ids": [int(i) for i in ids],
        },
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    """float32 log-probabilities of float32 logits, normalized in float64 a block of rows at a time."""
    out = np.empty(logits.shape, dtype=np.float32)
    for start in range(0, logits.shape[0], _ROW_CHUNK):
        x = logits[start : start + _ROW_CHUNK].astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))
        out[start : start + _ROW_CHUNK] = x - lse
    return out


class LlamaTokenizer:
    """llama.cpp's own tokenizer of a GGUF file (its vocabulary only: no weights are loaded). The reference
    tokenizes the text it scores itself, so no engine's tokenizer is needed: each engine then scores the
    reference's token ids."""

    def __init__(self, model_path: Path) -> None:
        self._llm = llama_cpp_module().Llama(model_path=str(model_path), vocab_only=True, verbose=False)

    def encode(self, text: str) -> list[int]:
        """The text's token ids, a BOS first where the model's vocabulary asks for one; special tokens'
        text is read as text."""
        return [int(t) for t in self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)]

    def decode(self, ids: list[int]) -> str:
        return self._llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    @property
    def eot_ids(self) -> frozenset[int]:
        """The tokens that end a turn (end of generation, end of text)."""
        vocab = llama_cpp_module().llama_model_get_vocab(self._llm.model)
        found = {self._llm.token_eos(), llama_cpp_module().llama_vocab_eot(vocab)}
        return frozenset(int(t) for t in found if t is not None and t >= 0)

    def close(self) -> None:
        _close(self._llm)


def load_tokenizer(model_path: Path) -> LlamaTokenizer:
    """llama.cpp's tokenizer for a GGUF file."""
    return LlamaTokenizer(model_path)


def open_llama(
    model_path: Path, n_ctx: int, *, logits_all: bool, n_threads: int
) -> tuple[Any, dict[str, Any]]:
    """A llama.cpp context and the settings it runs with (for the record's config)."""
    llama_cpp = llama_cpp_module()
    llm = llama_cpp.Llama(
        model_path=str(model_path),
        n_ctx=n_ctx,
        logits_all=logits_all,
        flash_attn=FLASH_ATTN,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        verbose=False,
    )
    config = {
        "n_ctx": n_ctx,
        "n_batch": int(llm.n_batch),
        "n_ubatch": int(llm.context_params.n_ubatch),
        "flash_attn": FLASH_ATTN,
        "logits_all": logits_all,
        "n_threads": n_threads,
        "llama_cpp": llama_cpp.__version__,
        "tokenizer": "llama.cpp",
        "reference_build": build_identity(),
    }
    return llm, config


def _close(llm: Any) -> None:
    close = getattr(llm, "close", None)
    if close is not None:
        close()


def _last_logits(llm: Any) -> np.ndarray:
    """A copy of the logits of the last evaluated token (logits_all=False keeps only that row)."""
    llama_cpp = llama_cpp_module()
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def _read_cache(key: str, ids: list[int]) -> tuple[np.ndarray, dict[str, Any]] | None:
    base = reference_cache_dir() / key
    try:
        meta = json.loads(Path(f"{base}.json").read_text())
        arr = np.load(f"{base}.npy")
    except (OSError, ValueError):
        return None
    # A sidecar that disagrees (a torn write, a hand edit) is a miss, not an answer.
    if not isinstance(meta, dict) or meta.get("ids") != ids or "config" not in meta or "timings" not in meta:
        return None
    if arr.dtype != np.float32 or arr.ndim != 2 or arr.shape[0] != len(ids) - 1:
        return None
    return arr, meta


def _write_cache(key: str, arr: np.ndarray, meta: dict[str, Any]) -> None:
    root = reference_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    # The .npy goes in first and the .json last, each renamed into place, so a reader never sees half.
    for suffix, write in (
        (".npy", lambda f: np.save(f, arr)),
        (".json", lambda f: f.write(json.dumps(meta).encode())),
    ):
        fd, tmp = tempfile.mkstemp(prefix=f"{key}.", suffix=".partial", dir=root)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(tmp, root / f"{key}{suffix}")
        finally:
            Path(tmp).unlink(missing_ok=True)


def score_ids(
    model_path: Path,
    ids: list[int],
    *,
    model_sha: str | None = None,
    n_threads: int | None = None,
    use_cache: bool = True,
) -> ScoreResult:
    """Teacher-forced log-probs (len(ids)-1, n_vocab) from llama.cpp, from the cache when possible."""
    if len(ids) < 2:
        raise ReferenceFailure(f"scoring needs at least 2 token ids, got {len(ids)}")
    ids = [int(i) for i in ids]
    sha = model_sha or model_sha256(model_path)
    key = cache_key(sha, build_identity(), FLASH_ATTN, ids)
    if use_cache:
        t0 = time.perf_counter()
        hit = _read_cache(key, ids)
        if hit is not None:
            arr, meta = hit
            return ScoreResult(
                arr,
                ids,
                meta["config"],
                {"load_s": 0.0, "score_s": time.perf_counter() - t0},
                cached=True,
                cache_key=key,
                computed_timings=meta["timings"],
            )
    threads = n_threads or default_threads()
    t0 = time.perf_counter()
    llm, config = open_llama(model_path, aligned_ctx(len(ids)), logits_all=True, n_threads=threads)
    load_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        llm.reset()
        llm.eval(ids[:-1])  # the last id is only a target: nothing is predicted from it
        arr = log_softmax_rows(np.asarray(llm.scores[: llm.n_tokens]))
        score_s = time.perf_counter() - t0
    finally:
        _close(llm)
    timings = {"load_s": load_s, "score_s": score_s}
    if use_cache:
        meta = {"key": key, "model_sha256": sha, "ids": ids, "config": config, "timings": timings}
        try:
            _write_cache(key, arr, meta)
        except OSError as exc:  # a read-only cache costs a recomputation next time, not this result
            print(f"warning: cannot write the reference cache: {exc}", file=sys.stderr)
    return ScoreResult(arr, ids, config, timings, cached=False, cache_key=key, computed_timings=timings)


def greedy_generate(
    model_path: Path,
    prompt_ids: list[int],
    max_new: int,
    *,
    stop_ids: frozenset[int] = frozenset(),
    n_threads: int | None = None,
) -> dict[str, Any]:
    """Greedy (argmax) continuation of prompt_ids: token ids, top1-top2 logit margins, config and timings."""
    if not prompt_ids:
        raise ReferenceFailure("generation needs a non-empty prompt")
    if max_new <= 0:
        raise ReferenceFailure(f"--max-new must be positive, got {max_new}")
    threads = n_threads or default_threads()
    t0 = time.perf_counter()
    llm, config = open_llama(
        model_path, aligned_ctx(len(prompt_ids) + max_new), logits_all=False, n_threads=threads
    )
    load_s = time.perf_counter() - t0
    tokens: list[int] = []
    margins: list[float] = []
    stop_reason = "length"
    try:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(list(prompt_ids))
        t1 = time.perf_counter()
        while True:
            logits = _last_logits(llm)
            top2 = np.partition(logits, -2)[-2:]
            token = int(logits.argmax())  # first index on ties, as torch.argmax
            tokens.append(token)
            margins.append(float(top2[1] - top2[0]))
            if token in stop_ids:
                stop_reason = "stop"
                break
            if len(tokens) == max_new:
                break
            llm.eval([token])
        t2 = time.perf_counter()
    finally:
        _close(llm)
    return {
        "token_ids": tokens,
        "margins": margins,
        "stop_reason": stop_reason,
        "config": config,
        "timings": {"load_s": load_s, "prefill_s": t1 - t0, "decode_s": t2 - t1},
    }


_AUDIT_SCHEMA = "evalbot.reference.audit/1"


def _audit_key(model_sha: str, build: dict[str, Any], prompt: list[int], tokens: list[int]) -> str:
    blob = json.dumps(
        {
            "schema": _AUDIT_SCHEMA,
            "model_sha256": model_sha,
            "lib_sha256": build.get("lib_sha256"),
            "cmake_args": build.get("cmake_args"),
            "llama_cpp": build.get("llama_cpp_python"),
            "flash_attn": FLASH_ATTN,
            "prompt": prompt,
            "tokens": tokens,
        },
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _row_summary(logits: np.ndarray) -> tuple[int, float]:
    """(argmax, top-1 minus top-2 log-probability) of one row of raw logits."""
    top2 = np.partition(logits, -2)[-2:]
    return int(logits.argmax()), float(top2[1] - top2[0])  # a logit gap is the log-probability gap


def audit_sequences(
    model_path: Path,
    items: list[dict[str, Any]],
    *,
    model_sha: str | None = None,
    n_threads: int | None = None,
) -> list[dict[str, Any]]:
    """For each {key, prompt, tokens}: llama.cpp's argmax, top-2 margin and the token's gap below the top-1
    at every position that predicts one of the tokens, teacher-forced on those tokens. Sequences sharing a prompt evaluate it
    once (the state after it is saved and restored); each result is cached by the sequence's hash."""
    sha = model_sha or model_sha256(model_path)
    build = build_identity()
    out: dict[str, dict[str, Any]] = {}
    todo: dict[tuple[int, ...], list[tuple[dict[str, Any], str]]] = {}
    root = reference_cache_dir() / "audit"
    for item in items:
        prompt, tokens = [int(t) for t in item["prompt"]], [int(t) for t in item["tokens"]]
        key = _audit_key(sha, build, prompt, tokens)
        try:
            cached = json.loads((root / f"{key}.json").read_text())
            if "gap" not in cached:  # written before the audit asked for each token's gap: redo it
                raise ValueError("no gap")
            out[item["key"]] = {"key": item["key"], **cached, "cached": True}
        except (OSError, ValueError):
            todo.setdefault(tuple(prompt), []).append((item, key))
    if todo:
        longest = max(len(p) + max(len(i["tokens"]) for i, _ in group) for p, group in todo.items())
        llm, _ = open_llama(
            model_path, aligned_ctx(longest + 1), logits_all=False, n_threads=n_threads or default_threads()
        )
        try:
            for prefix, group in todo.items():
                llm.reset()
                llm.eval(list(prefix))
                first_row = _last_logits(llm)
                state = llm.save_state()
                for item, key in group:
                    llm.load_state(state)
                    argmax, margin, gap, row = [], [], [], first_row
                    for t in item["tokens"]:
                        a, m = _row_summary(row)
                        argmax.append(a)
                        margin.append(m)
                        gap.append(float(row[a] - row[int(t)]))  # logits: the normalizer cancels
                        llm.eval([int(t)])
                        row = _last_logits(llm)
                    result = {"argmax": argmax, "margin": margin, "gap": gap}
                    out[item["key"]] = {"key": item["key"], **result, "cached": False}
                    try:
                        root.mkdir(parents=True, exist_ok=True)
                        tmp = root / f".{key}.{os.getpid()}.partial"
                        tmp.write_text(json.dumps(result))
                        os.replace(tmp, root / f"{key}.json")
                    except OSError as exc:
                        print(f"warning: cannot write the audit cache: {exc}", file=sys.stderr)
        finally:
            _close(llm)
    return [out[item["key"]] for item in items]


def _bench_once(llm: Any, prompt: list[int], n_gen: int) -> tuple[float, float]:
    """(prefill seconds for the prompt, decode seconds for n_gen single-token greedy steps after it)."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    token = int(_last_logits(llm).argmax())
    t1 = time.perf_counter()
    for _ in range(n_gen):
        llm.eval([token])
        token = int(_last_logits(llm).argmax())
    return t1 - t0, time.perf_counter() - t1


def bench_ids(
    model_path: Path,
    prompt: list[int],
    n_gen: int,
    *,
    runs: int = 1,
    warmup: int = 1,
    n_threads: int | None = None,
) -> dict[str, Any]:
    """llama.cpp prefill and decode throughput for prompt then n_gen greedy steps (median over runs)."""
    if not prompt or n_gen <= 0 or runs <= 0:
        raise ReferenceFailure(
            f"bench needs a prompt, --gen > 0 and --runs > 0 (got {len(prompt)}, {n_gen}, {runs})"
        )
    threads = n_threads or default_threads()
    t0 = time.perf_counter()
    llm, config = open_llama(
        model_path, aligned_ctx(len(prompt) + n_gen + 1), logits_all=False, n_threads=threads
    )
    load_s = time.perf_counter() - t0
    prefill: list[float] = []
    decode: list[float] = []
    try:
        # Same warm-up as the engine's bench: a short pass that faults in the weights, not timed.
        for _ in range(warmup):
            _bench_once(llm, prompt[: min(len(prompt), 64)], min(n_gen, 4))
        for r in range(runs):
            p, d = _bench_once(llm, prompt, n_gen)
            prefill.append(len(prompt) / p)
            decode.append(n_gen / d)
            print(
                f"run {r + 1}/{runs}: prefill {prefill[-1]:.1f} tok/s, decode {decode[-1]:.2f} tok/s",
                file=sys.stderr,
            )
    finally:
        _close(llm)
    return {
        "prefill_tps": statistics.median(prefill),
        "decode_tps": statistics.median(decode),
        "prefill_tps_runs": prefill,
        "decode_tps_runs": decode,
        "config": config,
        "timings": {
            "load_s": load_s,
            "prefill_s": sum(len(prompt) / x for x in prefill),
            "decode_s": sum(n_gen / x for x in decode),
        },
    }
