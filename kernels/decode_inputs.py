"""The inputs of a one-token decode attention kernel, checked alike for each (`unsupported_reasons`): q
[B, Hq, D] and caches [B, Hkv, S_max, D] of one shape, a head dim the kernel has, a GQA group it can pad,
float16 or bfloat16 throughout, contiguous last dims, int32 lengths [B], and every tensor on one device."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def well_formed(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether q and the cache have the ranks every other check indexes."""
    return q.dim() == 3 and k_cache.dim() == 4


def one_device(*tensors: torch.Tensor) -> bool:
    return len({t.device for t in tensors}) == 1


def input_reasons(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    head_dims: Sequence[int],
    max_gqa_ratio: int,
) -> list[str]:
    """Why a decode kernel with these head dims and this largest GQA ratio cannot take these inputs (what any
    such kernel checks; each adds its own); empty when it can."""
    if not well_formed(q, k_cache):
        return [
            f"expected q [B, Hq, D] and caches [B, Hkv, S_max, D], got {tuple(q.shape)}, {tuple(k_cache.shape)}"
        ]
    reasons = []
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    if v_cache.shape != k_cache.shape:
        reasons.append(f"k and v caches differ in shape: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    if k_cache.shape[0] != b or k_cache.shape[3] != d:
        reasons.append(f"cache {tuple(k_cache.shape)} does not match q {tuple(q.shape)} in batch or head dim")
    if d not in head_dims:
        reasons.append(f"head dim {d} not in {tuple(head_dims)}")
    if hkv == 0 or hq % hkv:
        reasons.append(f"query heads {hq} not a multiple of kv heads {hkv}")
    elif hq // hkv > max_gqa_ratio:
        reasons.append(f"GQA ratio {hq // hkv} > {max_gqa_ratio}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"dtype {q.dtype} is not float16 or bfloat16")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        reasons.append(f"dtypes differ: q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}")
    if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache)):
        reasons.append("last dim of q, k or v is not contiguous")
    if lengths.dtype != torch.int32 or tuple(lengths.shape) != (b,):
        reasons.append(f"lengths must be int32 [{b}], got {lengths.dtype} {tuple(lengths.shape)}")
    if not one_device(q, k_cache, v_cache, lengths):
        devices = {t.device for t in (q, k_cache, v_cache, lengths)}
        reasons.append(f"tensors on different devices: {sorted(map(str, devices))}")
    return reasons
