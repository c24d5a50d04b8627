"""Load a model and run it: chunked prefill, token-by-token decode, teacher-forced scoring."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine import ops
from engine.config import ModelConfig
from engine.cuda_graph import GraphedBlock, GraphedDecode
from engine.gguf import GGUFFile
from engine.kv_cache import KVCache
from engine.model import Transformer, load_transformer
from engine.model_file import model_sha256, resolve
from engine.sampling import SamplingParams, make_generator, sample
from engine.shapes import random_transformer, shape_config, shape_digest
from engine.tokenizer import Tokenizer

DEFAULT_PREFILL_CHUNK = 512


@dataclass
class LoadedModel:
    """A model ready to run, and where it came from (random-weight shapes have no file or tokenizer)."""

    path: Path | None
    sha256: str
    cfg: ModelConfig
    tokenizer: Tokenizer | None
    transformer: Transformer
    device: torch.device
    load_s: float
    random_weights: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on the CPU, bf16 on CUDA."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load(
    model: str | Path, device: str = "cpu", dtype: torch.dtype | None = None, max_pos: int | None = None
) -> LoadedModel:
    """Resolve, validate and dequantize a GGUF model once; max_pos bounds the RoPE table."""
    t0 = time.perf_counter()
    path = resolve(str(model))
    gf = GGUFFile(path)
    gf.require_supported()
    cfg = ModelConfig.from_metadata(gf.metadata, frozenset(gf.tensors))
    tok = Tokenizer.from_metadata(gf.metadata)
    dev = torch.device(device)
    transformer = load_transformer(gf, cfg, max_pos or cfg.context_length, dev, dtype or default_dtype(dev))
    gf.close()
    return LoadedModel(path, model_sha256(path), cfg, tok, transformer, dev, time.perf_counter() - t0)


def load_random(
    shape: str,
    device: str = "cuda",
    dtype: torch.dtype | None = None,
    seed: int = 0,
    max_pos: int | None = None,
) -> LoadedModel:
    """A real model shape with random weights, built on the device (for timing only)."""
    t0 = time.perf_counter()
    cfg = shape_config(shape)
    dev = torch.device(device)
    dt = dtype or default_dtype(dev)
    transformer = random_transformer(cfg, dev, dt, seed, max_pos)
    return LoadedModel(
        None,
        shape_digest(cfg, seed),
        cfg,
        None,
        transformer,
        dev,
        time.perf_counter() - t0,
        random_weights=True,
    )


@dataclass
class Generation:
    """What one generate call produced, with timings that separate prefill from decode."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    stop_reason: str = "length"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    margins: list[float] = field(default_factory=list)  # greedy only: top-1 minus top-2 logit per token


def _margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


class Session:
    """One sequence's KV cache plus the model: prefill, step, generate, score."""

    def __init__(
        self,
        model: LoadedModel,
        max_seq: int,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        cuda_graph: bool = True,
        block: int = 0,
    ):
        """block > 0: the row-invariant mode for lossless speculation (`Transformer.block`): every decode
        step and every verify pass of up to `block` tokens is one block of that width, so a position's
        logits are the same bits either way."""
        cfg = model.cfg
        if max_seq > cfg.context_length:
            raise ValueError(f"{max_seq} positions exceed the model's context length {cfg.context_length}")
        if block < 0:
            raise ValueError(f"block must be >= 0, got {block}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.block = block
        # a block's padding rows write past the last real position: room for them
        self.cache = KVCache(
            cfg.n_layer,
            1,
            cfg.n_kv_head,
            max_seq + max(0, block - 1),
            cfg.head_dim,
            model.dtype,
            model.device,
        )
        self.max_seq = max_seq
        self.on_cuda = model.device.type == "cuda"
        self._pos = torch.zeros(1, dtype=torch.long, device=model.device)
        self.graph: GraphedDecode | None = None
        self._blocks: dict[int, GraphedBlock] = {}
        if block:
            self.split = ops.block_split(self.cache.max_seq, cfg.n_kv_head, model.device)
            self._block_ids = torch.zeros(1, block, dtype=torch.long, device=model.device)
            if self.on_cuda and cuda_graph:
                for n_real in (1, block):
                    self._blocks[n_real] = GraphedBlock(
                        model.transformer, self.cache, block, n_real, self.split
                    )
        elif self.on_cuda and cuda_graph:
            # on CUDA, single tokens go through the graph-safe decode path, replayed from a graph
            self.graph = GraphedDecode(model.transformer, self.cache)

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def graphed(self) -> bool:
        """Whether decode replays a captured CUDA graph."""
        return self.graph is not None or bool(self._blocks)

    def _run_block(self, ids: torch.Tensor, start: torch.Tensor, n_real: int) -> torch.Tensor:
        """One block (ids: up to `block` tokens on the device) at device position start; logits [block, V]."""
        if n_real in self._blocks:
            return self._blocks[n_real](ids, start)
        buf = self._block_ids
        buf[0, : ids.numel()].copy_(ids.view(-1))
        return self.model.transformer.block(buf, start.view(1), self.cache, n_real, self.split)

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], all_logits: bool = False) -> torch.Tensor:
        """Append tokens to the sequence in prefill-sized chunks; float32 logits [T, V] or the last [V]."""
        if not ids:
            raise ValueError("forward needs at least one token")
        if self.block and self.cache.length and len(ids) <= self.block:
            # after the prompt, every pass is one block: decode (one row) or verify (up to `block` rows)
            if self.cache.length + len(ids) > self.max_seq:
                raise ValueError(f"the KV cache is full ({self.max_seq} positions)")
            n_real = 1 if len(ids) == 1 else self.block
            tokens = torch.tensor(list(ids), dtype=torch.long, device=self.model.device)
            logits = self._run_block(tokens, self._pos.fill_(self.cache.length), n_real)[: len(ids)].clone()
            self.cache.length += len(ids)
            return logits if all_logits else logits[-1]
        if self.on_cuda and len(ids) == 1 and not all_logits:
            return self.step(int(ids[0]))
        outs = []
        for i in range(0, len(ids), self.prefill_chunk):
            chunk = torch.tensor([list(ids[i : i + self.prefill_chunk])], device=self.model.device)
            logits = self.model.transformer(chunk, self.cache.length, self.cache, last_only=not all_logits)
            self.cache.length += chunk.shape[1]
            outs.append(logits[0])
        return torch.cat(outs) if all_logits else outs[-1][-1]

    @torch.inference_mode()
    def step(self, token: int) -> torch.Tensor:
        """Decode one token through the graph-safe path (replayed from the CUDA graph if any); logits [V].

        The result is a copy: a graph's output buffer is overwritten by the next replay.
        """
        if self.cache.length >= self.max_seq:
            raise ValueError(f"the KV cache is full ({self.max_seq} positions)")
        if self.block:
            token_t = torch.full((1,), token, dtype=torch.long, device=self.model.device)
            logits = self._run_block(token_t, self._pos.fill_(self.cache.length), 1)[:1].clone()
        elif self.graph is not None:
            logits = self.graph(token, self.cache.length).clone()
        else:
            ids = torch.full((1, 1), token, dtype=torch.long, device=self.model.device)
            logits = self.model.transformer.decode(ids, self._pos.fill_(self.cache.length), self.cache)
        self.cache.length += 1
        return logits[0]

    @torch.inference_mode()
    def greedy_on_device(self, first: torch.Tensor, n: int) -> torch.Tensor:
        """n greedy decode steps with the tokens kept on the device (no host sync per token); ids [n]."""
        out = torch.empty(n, dtype=torch.long, device=self.model.device)
        token = first.view(1, 1)
        pos = self._pos.fill_(self.cache.length)
        for i in range(n):
            if self.block:
                logits = self._run_block(token, pos, 1)[:1]
            elif self.graph is not None:
                logits = self.graph(token, pos)
            else:
                logits = self.model.transformer.decode(token, pos, self.cache)
            token = logits.argmax(-1).view(1, 1)
            out[i : i + 1].copy_(token[0])
            pos.add_(1)
        self.cache.length += n
        return out

    def reset(self) -> None:
        self.cache.truncate(0)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new: int,
        params: SamplingParams | None = None,
        stop_ids: frozenset[int] = frozenset(),
        on_token: Callable[[int], None] | None = None,
        stream: bool = True,
        resume: bool = False,
    ) -> Generation:
        """Prefill the prompt, then decode up to max_new tokens (stopping at a stop id). With `resume` the
        prompt continues the sequence already in the cache (`prefill`) instead of starting a new one.

        With `stream` (the default) `on_token` sees every token as it is decoded, which costs a host sync
        per token. Without it, a greedy generation with no stop ids hands `on_token` the first token only
        and decodes the rest with the tokens kept on the device (one sync at the end; on CUDA the GPU then
        runs the steps back to back): the same tokens, no per-token margins."""
        held = self.length if resume else 0
        if held + len(prompt_ids) + max_new > self.max_seq:
            raise ValueError(
                f"prompt {held} + {len(prompt_ids)} + {max_new} new tokens exceed the cache ({self.max_seq})"
            )
        params = params or SamplingParams()
        if not resume:
            self.reset()
        out = Generation(list(prompt_ids))
        gen = make_generator(params) if not params.greedy else None
        self._sync()
        t0 = time.perf_counter()
        logits = self.forward(prompt_ids)
        token = int(sample(logits[None], params, gen)[0])
        self._sync()
        t1 = time.perf_counter()
        out.prefill_s = t1 - t0
        if not stream and params.greedy and not stop_ids and max_new > 1:
            if on_token:
                on_token(token)
            first = torch.tensor([token], dtype=torch.long, device=self.model.device)
            rest = self.greedy_on_device(first, max_new - 1).tolist()  # .tolist() is the one sync
            out.token_ids = [token, *rest]
            out.decode_s = time.perf_counter() - t1
            return out
        for i in range(max_new):
            if params.greedy:
                out.margins.append(_margin(logits))
            out.token_ids.append(token)
            if on_token:
                on_token(token)
            if token in stop_ids:
                out.stop_reason = "stop"
                break
            if i + 1 == max_new:
                break
            logits = self.forward([token])
            token = int(sample(logits[None], params, gen)[0])
        self._sync()
        out.decode_s = time.perf_counter() - t1
        return out

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int]) -> float:
        """Start a new sequence with the prompt in the cache, and nothing decoded; returns the seconds it
        took. `generate(..., resume=True)` continues it."""
        if len(prompt_ids) >= self.max_seq:
            raise ValueError(f"prompt {len(prompt_ids)} leaves no room in the cache ({self.max_seq})")
        self.reset()
        self._sync()
        t0 = time.perf_counter()
        self.forward(prompt_ids)
        self._sync()
        return time.perf_counter() - t0

    @torch.inference_mode()
    def score(self, ids: Sequence[int], start: int = 1) -> torch.Tensor:
        """Teacher-forced log-probabilities [len(ids)-start, V]: row i predicts ids[start+i].

        Only the rows asked for get logits: an audit of 128 generated tokens after a 16k prompt keeps
        128 rows of the vocabulary, not 16k (on an 8B shape that is 0.15 GB instead of 60 GB at peak).
        """
        if len(ids) < 2:
            raise ValueError("scoring needs at least two tokens")
        if not 1 <= start < len(ids):
            raise ValueError(f"start: expected 1..{len(ids) - 1}, got {start}")
        self.reset()
        if start > 1:
            self.forward(ids[: start - 1])  # the prompt's prefix: only its KV cache is needed
        rows = []
        for i in range(start - 1, len(ids) - 1, self.prefill_chunk):  # normalized per chunk, in float64
            logits = self.forward(ids[i : min(i + self.prefill_chunk, len(ids) - 1)], all_logits=True)
            rows.append(torch.log_softmax(logits.double(), dim=-1).float())
        return torch.cat(rows)
