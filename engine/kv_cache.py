"""A preallocated (static) KV cache: one buffer per layer, written in place, never reallocated."""

from __future__ import annotations

import torch


class KVCache:
    """K and V for every layer: [n_layer, B, Hkv, max_seq, D], with writes by position."""

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_kv_head: int,
        max_seq: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (n_layer, batch, n_kv_head, max_seq, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq = max_seq
        self.length = 0  # positions filled and valid (host-side bookkeeping)

    def write(
        self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values ([B, Hkv, T, D]) at positions pos ([T]); return the layer's buffers."""
        kc, vc = self.k[layer], self.v[layer]
        kc.index_copy_(2, pos, k.to(kc.dtype))
        vc.index_copy_(2, pos, v.to(vc.dtype))
        return kc, vc

    def truncate(self, length: int) -> None:
        """Roll back to the first `length` positions (later ones are overwritten when reached again)."""
        if not 0 <= length <= self.max_seq:
            raise ValueError(f"cannot truncate a {self.max_seq}-position cache to {length}")
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
