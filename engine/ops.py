"""Kernel dispatch: the one place the engine reaches ``kernels``.

The model calls these functions and never a kernel directly, so a faster kernel (or a contributor's)
is a change here, not in the model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.kv_cache import KVCache
from kernels import reference


def attention(
    q: torch.Tensor,  # [B, Hq, T, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    n_ctx: int,  # valid cache positions after this step's keys were written (start + T)
    scale: float,
) -> torch.Tensor:  # [B, Hq, T, D]
    """Causal GQA attention of the new queries over the first n_ctx cached positions."""
    if q.is_cuda:
        return _sdpa_causal(q, k_cache[:, :, :n_ctx], v_cache[:, :, :n_ctx], scale)
    return reference.attention(q, k_cache[:, :, :n_ctx], v_cache[:, :, :n_ctx], scale)


def _sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # torch's fused attention for (eager) prefill on CUDA; queries sit at the last T of S positions
    t, s = q.shape[2], k.shape[2]
    if t == s:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    mask = torch.arange(s, device=q.device)[None, :] <= torch.arange(s - t, s, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def decode_backend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor) -> str:
    """Which kernel decode attention uses for these inputs: 'triton-flash-decode' or 'torch-reference'."""
    if q.is_cuda and not _flash_decode().unsupported_reasons(q, k_cache, v_cache, lengths):
        return "triton-flash-decode"
    return "torch-reference"


def _flash_decode():  # type: ignore[no-untyped-def]
    # imported on first CUDA use: triton comes with CUDA builds of torch, and CPU installs may lack it
    from kernels import flash_decode

    return flash_decode


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D] one new query per sequence
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int32 on q's device: valid positions per sequence
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """One-token attention with device-side lengths (CUDA-graph safe): Triton on CUDA, reference elsewhere."""
    if decode_backend(q, k_cache, v_cache, lengths) == "triton-flash-decode":
        return _flash_decode().flash_decode(q, k_cache, v_cache, lengths, scale, num_splits=num_splits)
    return reference.decode_attention(q, k_cache, v_cache, lengths, scale)


def decode_config(n_head: int, cache: KVCache, num_splits: int | None = None) -> dict[str, Any]:
    """The effective decode-attention settings for a cache (backend, and the kernel's split count)."""
    k = cache.k[0]  # [B, Hkv, S_max, D]
    q = k.new_empty(k.shape[0], n_head, k.shape[-1])
    lengths = torch.full((k.shape[0],), cache.max_seq, dtype=torch.int32, device=k.device)
    backend = decode_backend(q, k, cache.v[0], lengths)
    if backend != "triton-flash-decode":
        return {"backend": backend}
    return {"backend": backend, **_flash_decode().decode_config(q, k, cache.v[0], lengths, num_splits=num_splits)}
