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
