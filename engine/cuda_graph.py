"""The decode step captured once in a CUDA graph and replayed.

Launching a 36-layer decode step op by op costs hundreds of kernel launches per token; replaying a
captured graph costs one. Inputs live in static device buffers (token ids, positions) and the
logits land in a static output, so nothing in the step depends on a host-side value.
"""

from __future__ import annotations

import torch

from engine.kv_cache import KVCache
from engine.model import Transformer


class GraphedDecode:
    """Transformer.decode for a fixed batch, captured over a given KV cache."""

    def __init__(self, transformer: Transformer, cache: KVCache, batch: int = 1, warmup: int = 2):
        if cache.length:
            raise ValueError(
                "capture the decode graph before the cache holds anything: warm-up writes position 0"
            )
        device = cache.k.device
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, dtype=torch.long, device=device)
        # warm up on a side stream first: lazy initialisation (cuBLAS handles, Triton compiles) must not be captured
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(warmup):
                transformer.decode(self.ids, self.pos, cache)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            self.logits = transformer.decode(self.ids, self.pos, cache)  # [B, V] float32, static

    def __call__(self, ids: torch.Tensor | int, pos: torch.Tensor | int) -> torch.Tensor:
        """Replay for the given token(s) and position(s); returns the static logits buffer [B, V]."""
        if isinstance(ids, int):
            self.ids.fill_(ids)
        else:
            self.ids.copy_(ids.view_as(self.ids))
        if isinstance(pos, int):
            self.pos.fill_(pos)
        else:
            self.pos.copy_(pos.view_as(self.pos))
        self.graph.replay()
        return self.logits


class GraphedBlock:
    """Transformer.block for a fixed width and number of real rows, captured over a given KV cache.

    Decode (one real row) and verify (all rows real) are two captures of the same block: the same
    shapes, so the same kernels, and a position's logits come out bit for bit the same in both."""

    def __init__(
        self, transformer: Transformer, cache: KVCache, width: int, n_real: int, split: int, warmup: int = 2
    ):
        if cache.length:
            raise ValueError("capture the block graph before the cache holds anything")
        device = cache.k.device
        self.ids = torch.zeros(1, width, dtype=torch.long, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(warmup):
                transformer.block(self.ids, self.start, cache, n_real, split)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            self.logits = transformer.block(self.ids, self.start, cache, n_real, split)  # [width, V]

    def __call__(self, ids: torch.Tensor, start: torch.Tensor | int) -> torch.Tensor:
        """Replay for ids (up to width of them; the rest keep what they held) at start; logits [width, V]."""
        self.ids[0, : ids.numel()].copy_(ids.view(-1))
        if isinstance(start, int):
            self.start.fill_(start)
        else:
            self.start.copy_(start.view(1))
        self.graph.replay()
        return self.logits
