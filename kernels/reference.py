"""Plain PyTorch references for every kernel in this package.

They are the ground truth the Triton kernels are tested against, and the path the engine takes on
devices without Triton. GQA is handled by grouping query heads per KV head (a reshape, not a copy
of K/V), so the reference reads the cache the way the kernels do.
"""

from __future__ import annotations

import torch


def attention(
    q: torch.Tensor,  # [B, Hq, T, D] queries at absolute positions start .. start+T-1
    k: torch.Tensor,  # [B, Hkv, S, D] keys for positions 0 .. S-1 (S = start + T)
    v: torch.Tensor,  # [B, Hkv, S, D]
    scale: float,
) -> torch.Tensor:  # [B, Hq, T, D]
    """Causal GQA attention of T new queries against a cache holding S = start + T positions."""
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of kv heads {hkv}")
    g = hq // hkv
    qg = q.reshape(b, hkv, g * t, d)  # the G heads of one KV head share its K/V
    scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale)  # [B, Hkv, G*T, S]
    if t > 1:
        start = s - t
        qpos = torch.arange(start, s, device=q.device).repeat(g)  # [G*T]
        kpos = torch.arange(s, device=q.device)
        scores.masked_fill_(kpos[None, :] > qpos[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).reshape(b, hq, t, d)


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D] one new query per sequence
    k: torch.Tensor,  # [B, Hkv, S_max, D] cache; only the first lengths[b] positions are valid
    v: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int, valid positions per sequence (>= 1)
    scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """One-token GQA attention with per-sequence cache lengths (positions past a length are ignored)."""
    b, hq, d = q.shape
    hkv, s_max = k.shape[1], k.shape[2]
    g = hq // hkv
    acc = torch.promote_types(q.dtype, torch.float32)  # float64 inputs stay float64
    qg = q.reshape(b, hkv, g, d).to(acc)
    scores = torch.matmul(qg, k.to(acc).transpose(-1, -2)).mul_(scale)  # [B, Hkv, G, S_max]
    valid = torch.arange(s_max, device=q.device)[None, :] < lengths.to(q.device)[:, None]  # [B, S_max]
    scores.masked_fill_(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # a probability of 0 does not cancel a NaN or inf that the cache holds past a length: zero those rows
    v_valid = v.to(acc).masked_fill(~valid[:, None, :, None], 0.0)
    out = torch.matmul(probs, v_valid)  # [B, Hkv, G, D]
    return out.reshape(b, hq, d).to(q.dtype)
