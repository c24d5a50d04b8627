"""Kernel dispatch: the one place the engine reaches ``kernels``.

The model calls these functions and never a kernel directly, so a faster kernel (or a contributor's)
is a change here, not in the model.
"""

from __future__ import annotations

import torch

from kernels import reference


def attention(
    q: torch.Tensor,  # [B, Hq, T, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    n_ctx: int,  # valid cache positions after this step's keys were written (start + T)
    scale: float,
) -> torch.Tensor:  # [B, Hq, T, D]
    """Causal GQA attention of the new queries over the first n_ctx cached positions."""
    return reference.attention(q, k_cache[:, :, :n_ctx], v_cache[:, :, :n_ctx], scale)
