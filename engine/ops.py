"""Kernel dispatch: the one place the engine reaches ``kernels``.

The model calls these functions and never a kernel directly, so a faster kernel (or a contributor's)
is a change here, not in the model.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from engine import kernel_choice
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


# Decode-attention kernels in preference order: the table the engine chooses by (the first that takes the
# inputs and passes its parity test at the shape; nothing is timed, so every process picks the same one).
# Measured on the H200 (docs/benchmarks.md, 2026-12-04): at batch 1, the engine's serving batch, Triton's
# split-KV kernel beats the cluster kernel at every shape timed (8.6-35 us against 10-44); at batch 8 the
# two are within 2%. A near-tie in a measured choice (BY_TIMING) goes to the earlier one too.
DECODE_KERNELS = ("triton-flash-decode", "cuda-cluster-decode", "torch-reference")
# the decode-kernel pin that times the candidates at load instead of following the table: an experiment,
# since near-ties let fresh processes of the same code pick differently (docs/benchmarks.md, #40)
BY_TIMING = "by-timing"
# Parity bar of a candidate against the fp32 reference at its shape (norm-relative error): bf16 rounds
# the output to 8 bits (about 4e-3 relative per element), fp16 to 11.
PARITY_TOLERANCE = {torch.bfloat16: 5e-3, torch.float16: 2e-3, torch.float32: 1e-4}


@dataclass(frozen=True)
class DecodeChoice:
    """The decode-attention kernel chosen at one shape, and the trials behind the choice."""

    backend: str
    how: str  # "table", "measured", "pinned splits", "graph capture (not measured)", "cpu"
    trials: tuple[kernel_choice.Trial, ...] = ()

    def record(self) -> dict[str, Any]:
        """JSON form for the engine's `config`: the backend, how it was chosen, each candidate's result."""
        return {
            "backend": self.backend,
            "chosen_by": self.how,
            "candidates": {t.name: {"rel_err": t.rel_err, "us": t.us, "error": t.error} for t in self.trials},
        }


_decode_choices: dict[tuple, DecodeChoice] = {}


def _flash_decode() -> ModuleType:
    # imported on first CUDA use: triton comes with CUDA builds of torch, and CPU installs may lack it
    from kernels import flash_decode

    return flash_decode


def _cluster_decode() -> ModuleType:
    from kernels import cluster_decode

    return cluster_decode


def _decode_candidates(scale: float) -> list[tuple[str, Any, Any]]:
    """(name, run(q, k, v, lengths, out=), unsupported_reasons(q, k, v, lengths)) in preference order."""
    cluster, triton_fd = _cluster_decode(), _flash_decode()

    def torch_run(q, k, v, lengths, out):
        return out.copy_(reference.decode_attention(q, k, v, lengths, scale))

    runs = {
        "triton-flash-decode": (lambda q, k, v, n, out: triton_fd.flash_decode(q, k, v, n, scale, out=out),
                                triton_fd.unsupported_reasons),
        "cuda-cluster-decode": (lambda q, k, v, n, out: cluster.flash_decode(q, k, v, n, scale, out=out),
                                cluster.unsupported_reasons),
        "torch-reference": (torch_run, lambda *args: []),
    }  # fmt: skip
    return [(name, *runs[name]) for name in DECODE_KERNELS]


def _trial_inputs(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, seed: int, timed: bool = True):
    """Parity cases at the shape (full and ragged lengths, NaN past each length) and the timed copies
    (none unless `timed`)."""
    b, hq, d = q.shape
    _, hkv, s_max, _ = k.shape
    gen = torch.Generator(device=q.device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=q.device, dtype=q.dtype, generator=gen)

    qs, ks, vs = randn(b, hq, d), randn(b, hkv, s_max, d), randn(b, hkv, s_max, d)
    full = torch.full((b,), s_max, dtype=torch.int32, device=q.device)
    ragged = torch.randint(1, s_max + 1, (b,), device=q.device, dtype=torch.int32, generator=gen)
    ragged[0] = 1 if b > 1 else ragged[0]
    cases, clean = [], []
    for n in (full, ragged):
        valid = torch.arange(s_max, device=q.device)[None, :] < n[:, None]  # [B, S_max]
        poison = (~valid)[:, None, :, None]
        cases.append((qs, ks.masked_fill(poison, float("nan")), vs.masked_fill(poison, float("nan")), n))
        clean.append((qs, ks, vs, n))
    if not timed:
        return cases, clean, None
    kv_bytes = 2 * ks.numel() * ks.element_size()
    l2 = torch.cuda.get_device_properties(q.device).L2_cache_size
    copies = min(8, max(1, -(-3 * l2 // kv_bytes)))  # enough that the timing never finds K/V in the L2
    return (
        cases,
        clean,
        [(randn(b, hq, d), randn(b, hkv, s_max, d), randn(b, hkv, s_max, d), full) for _ in range(copies)],
    )


def choose_decode_kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    by_timing: bool = False,
) -> DecodeChoice:
    """The decode-attention kernel at this shape (cached): the first in DECODE_KERNELS that passes the
    parity test there, or with `by_timing` the fastest of those that pass."""
    how = "measured" if by_timing else "table"
    key = (
        how,
        str(q.device),
        q.dtype,
        tuple(q.shape),
        tuple(k_cache.shape),
        k_cache.stride(),
        v_cache.stride(),
    )
    if key in _decode_choices:
        return _decode_choices[key]
    candidates = _decode_candidates(scale)
    if torch.cuda.is_current_stream_capturing():  # nothing can be measured inside a capture: not cached
        name = next(n for n, _, reasons in candidates if not reasons(q, k_cache, v_cache, lengths))
        return DecodeChoice(name, "graph capture (not measured)")
    unsupported = {n: reasons(q, k_cache, v_cache, lengths) for n, _, reasons in candidates}
    cases, clean, timed = _trial_inputs(
        q, k_cache, lengths, seed=zlib.crc32(repr(key[1:]).encode()), timed=by_timing
    )
    want = [reference.decode_attention(a.float(), b.float(), c.float(), n, scale) for a, b, c, n in clean]
    trials = kernel_choice.run_trials(
        [(n, run, (lambda *a, why=unsupported[n]: why)) for n, run, _ in candidates],
        cases,
        want,
        PARITY_TOLERANCE.get(q.dtype, 5e-3),
        timed=timed,
        time_fn=kernel_choice.device_time_us if by_timing else None,
    )
    chosen = kernel_choice.pick(trials) if by_timing else kernel_choice.first_passed(trials)
    choice = DecodeChoice(chosen, how, tuple(trials))
    _decode_choices[key] = choice
    return choice


def decode_backend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    num_splits: int | None = None,
    kernel: str | None = None,
) -> str:
    """Which kernel decode attention uses for these inputs (one of DECODE_KERNELS).

    On CUDA the first in DECODE_KERNELS that passes the parity test at the shape; a pinned split count
    (the Triton kernel's A/B experiments) takes the Triton kernel where it applies; elsewhere the torch
    reference. `kernel` pins one by name, or BY_TIMING times the candidates (A/B experiments); ValueError
    if a pinned kernel cannot take these inputs.
    """
    if kernel is not None and kernel != BY_TIMING:
        reasons = {n: why for n, _, why in _decode_candidates(1.0)}
        if kernel not in reasons:
            raise ValueError(f"unknown decode kernel {kernel!r}; known: {', '.join(DECODE_KERNELS)}")
        why = reasons[kernel](q, k_cache, v_cache, lengths)
        if why:
            raise ValueError(f"decode kernel {kernel} cannot take these inputs: {'; '.join(why)}")
        return kernel
    if not q.is_cuda:
        return "torch-reference"
    if num_splits is not None and not _flash_decode().unsupported_reasons(q, k_cache, v_cache, lengths):
        return "triton-flash-decode"
    return choose_decode_kernel(
        q, k_cache, v_cache, lengths, q.shape[-1] ** -0.5, kernel == BY_TIMING
    ).backend


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D] one new query per sequence
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int32 on q's device: valid positions per sequence
    scale: float,
    num_splits: int | None = None,
    kernel: str | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """One-token attention with device-side lengths (CUDA-graph safe), by the kernel `decode_backend` picks."""
    backend = decode_backend(q, k_cache, v_cache, lengths, num_splits, kernel)
    if backend == "cuda-cluster-decode":
        return _cluster_decode().flash_decode(q, k_cache, v_cache, lengths, scale)
    if backend == "triton-flash-decode":
        return _flash_decode().flash_decode(q, k_cache, v_cache, lengths, scale, num_splits=num_splits)
    return reference.decode_attention(q, k_cache, v_cache, lengths, scale)


def block_attention(
    q: torch.Tensor,  # [1, Hq, T, D]
    k_cache: torch.Tensor,  # [1, Hkv, S_max, D]
    v_cache: torch.Tensor,
    lengths: torch.Tensor,  # [1, T] int32
    scale: float,
    n_real: int,
    split: int,
) -> torch.Tensor:  # [1, Hq, T, D]
    """Row-invariant attention of a block's rows (`kernels.block_attention`): Triton on CUDA, PyTorch a
    row at a time elsewhere. Both keep a row's bits independent of the rows beside it."""
    from kernels import block_attention as ba

    if q.is_cuda and not ba.unsupported_reasons(q, k_cache):
        return ba.block_attention(q, k_cache, v_cache, lengths, scale, n_real, split)
    return ba.block_attention_torch(q, k_cache, v_cache, lengths, scale, n_real)


def block_split(cache_positions: int, n_kv_head: int, device: torch.device) -> int:
    """Positions per attention split of a row-invariant block session: a session constant (one program
    per SM at full length on CUDA; a nominal 8 SMs elsewhere), see `kernels.block_attention`."""
    from kernels.block_attention import split_size

    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    return split_size(cache_positions, 1, n_kv_head, sms)


def decode_config(
    n_head: int, cache: KVCache, num_splits: int | None = None, kernel: str | None = None
) -> dict[str, Any]:
    """The effective decode-attention settings for a cache: the backend, why, and its kernel's settings."""
    k = cache.k[0]  # [B, Hkv, S_max, D]
    q = k.new_empty(k.shape[0], n_head, k.shape[-1])
    lengths = torch.full((k.shape[0],), cache.max_seq, dtype=torch.int32, device=k.device)
    backend = decode_backend(q, k, cache.v[0], lengths, num_splits, kernel)
    if backend == "torch-reference" and not k.is_cuda:
        return {"backend": backend}
    if kernel is not None and kernel != BY_TIMING:
        record: dict[str, Any] = {"backend": backend, "chosen_by": "pinned kernel"}
    elif num_splits is not None and backend == "triton-flash-decode":
        record = {"backend": backend, "chosen_by": "pinned splits"}
    else:
        scale = k.shape[-1] ** -0.5
        record = choose_decode_kernel(q, k, cache.v[0], lengths, scale, kernel == BY_TIMING).record()
    if backend == "cuda-cluster-decode":
        return record | _cluster_decode().decode_config(q, k)
    if backend == "triton-flash-decode":
        return record | _flash_decode().decode_config(q, k, cache.v[0], lengths, num_splits=num_splits)
    return record
