"""Split-KV flash-decode: one new query token per sequence against a [B, Hkv, S_max, D] KV cache.

A partial kernel gives each (split, sequence, KV head) program every S-th tile of the sequence's
valid positions, starting at tile `split` (S splits); it loads the whole GQA group of query heads for
its KV head (padded to 16 rows for ``tl.dot``), so each K/V tile is read once for the group, and
writes the running (max, sum, unnormalised output) to fp32 scratch. A combine kernel merges the
splits of every query head with the log-sum-exp rescale (on Hopper it is launched early and waits on
the partial kernel: programmatic dependent launch); with a single split the partial kernel writes
the output itself.
Lengths are read on the device and the grid depends only on host ints (batch, heads, splits), so
with a preallocated ``FlashDecodeWorkspace`` a launch allocates nothing and can be graph-captured.
The kernels are wrapped with ``triton.jit`` on first call, not at import, and keyed on Triton's
interpreter flag (the tests run them in the interpreter on the CPU).
"""

import functools
import math
import os
from dataclasses import dataclass
from typing import TypedDict, Unpack

import torch
import triton
import triton.language as tl

from kernels.decode_inputs import input_reasons, one_device, well_formed

HEAD_DIMS = (64, 128, 256)
MAX_GQA_RATIO = 16  # the query group is padded to 16 rows for tl.dot, so up to 16 costs nothing extra
_GROUP_ROWS = 16  # smallest M that tl.dot accepts

# Split heuristic: one wave of programs, at most one per SM (measured on an H200 at batch 1: 128 or
# 132 programs beat 264 by 4-10%, since more splits only add scratch traffic and tails), and at
# least MIN_BLOCKS_PER_SPLIT tiles per split so the software pipeline has something to overlap.
PROGRAMS_PER_SM = 1
MIN_BLOCKS_PER_SPLIT = 4

# Per head dim: (BLOCK_N, num_warps, num_stages). A K plus a V tile is 32 KiB at d64/d128 and 64 KiB
# at d256; with one program per SM the pipeline may use most of the 228 KiB of shared memory, so
# deep stages keep 96-128 KiB of loads in flight per SM. Picked from an H200 sweep (bench script).
_TILES = {64: (128, 4, 4), 128: (64, 4, 4), 256: (64, 4, 3)}

# Combine programs: one warp each (its reductions over the splits stay inside the warp), over a 32-wide
# slice of the head dim, or a 16-wide one once 16 or more splits are merged at once (twice the programs
# to hide the L2 latency, 8 values a lane). Measured on the H200 against 4 warps and the other width at
# 4k-32k, batch 1 and 8, for GQA-4 and GQA-8 d128 and GQA-6 d256: the fastest of the four in 16 of the
# 18 cases and within 0.1 us in the other two (d256 at 16k-32k, batch 1); against the earlier rule (32
# wide, 4 warps at d128) 0.1-0.6 us faster at d128, batch 1, and 0.3-0.8 us at batch 8
# (docs/results/flash_decode_combine_h200_2026-11-30f.json).
_COMBINE_WARPS = 1
_COMBINE_WIDE_SPLITS = 16

# PDL wait: the partial kernel itself is launched early (programmatic dependent launch) and waits on
# the device (griddepcontrol.wait) for its predecessor's writes before it reads anything, so its launch
# overlaps the previous kernel's last blocks (which trigger it as they exit, even a kernel that knows
# nothing of PDL). Measured on the H200 with 36 calls per graph: 0.1-0.5 us faster at every shape,
# context and head dim, so on by default where supported. (A fused variant, the last program of each
# KV head merging the splits itself, measured 0.5-6 us slower and was removed: docs/benchmarks.md.)
PDL_WAIT_DEFAULT = True

# int64 fields per program in a timeline trace (bench --timeline): the partial kernel writes global-timer
# stamps at its start, loop start and end, its SM id, and stamps after its PDL wait and once its length
# has arrived; the combine writes its start, the end of its wait, its end, its SM id and a stamp once its
# loads have arrived (the last field stays 0).
TRACE_FIELDS = tl.constexpr(6)


@dataclass(frozen=True)
class FlashDecodeWorkspace:
    """Preallocated scratch for the partials, so launches allocate nothing (CUDA graphs)."""

    m: torch.Tensor  # [B_max, Hq, S] fp32 max of the scaled scores per split (natural log units)
    lsum: torch.Tensor  # [B_max, Hq, S] fp32 sum of exp(score - m) per split
    acc: torch.Tensor  # [B_max, Hq, S, D] fp32 sum of exp(score - m) * v per split (not normalised)

    @classmethod
    def allocate(
        cls, batch: int, num_q_heads: int, head_dim: int, num_splits: int, device: torch.device | str
    ) -> "FlashDecodeWorkspace":
        """Scratch for up to `batch` sequences and `num_splits` splits."""
        m = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=device)
        acc = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=device)
        return cls(m, torch.empty_like(m), acc)

    @property
    def num_splits(self) -> int:
        return self.m.shape[2]


def num_splits(num_sms: int, batch: int, num_kv_heads: int, ctx_len: int, block_n: int) -> int:
    """Splits per (sequence, KV head): one wave of programs over the SMs, each split >= MIN_BLOCKS_PER_SPLIT tiles.

    Of the split counts that give the busiest program the same number of tiles, the fewest: 33
    splits of 256 tiles leave 8 tiles to the busiest program, as 32 do, and the 33rd split still
    costs a program, a partial to write and a wider merge (measured on the H200 at d256, 16k-32k:
    32 splits 0-0.5 us faster).
    """
    blocks = max(1, -(-ctx_len // block_n))
    most = max(1, blocks // MIN_BLOCKS_PER_SPLIT)
    wanted = PROGRAMS_PER_SM * num_sms // max(1, batch * num_kv_heads)
    splits = max(1, min(wanted, most))
    return -(-blocks // -(-blocks // splits))


_split_heuristic = num_splits  # flash_decode's `num_splits` argument shadows the name


def tile_config(head_dim: int) -> dict[str, int]:
    """Default tile for a head dim: block_n (positions per K/V tile), num_warps, num_stages."""
    block_n, num_warps, num_stages = _TILES[head_dim]
    return {"block_n": block_n, "num_warps": num_warps, "num_stages": num_stages}


class Tuning(TypedDict, total=False):
    """Launch overrides for tuning experiments (None or absent: the default)."""

    block_n: int | None
    num_warps: int | None
    num_stages: int | None
    pdl: bool | None
    combine_block_d: int | None
    pdl_wait: bool | None
    combine_warps: int | None


def decode_config(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int32
    *,
    num_splits: int | None = None,
    workspace: "FlashDecodeWorkspace | None" = None,
    **tuning: Unpack[Tuning],
) -> dict[str, int | str]:
    """The settings `flash_decode` uses for the same arguments, for the engine's `config` record."""
    del v_cache, lengths  # the launch depends on shapes only; taken so both calls read alike
    return _resolve(q, k_cache, num_splits, workspace, **tuning)


def _resolve(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    num_splits: int | None,
    workspace: "FlashDecodeWorkspace | None",
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    pdl: bool | None = None,
    combine_block_d: int | None = None,
    pdl_wait: bool | None = None,
    combine_warps: int | None = None,
) -> dict:
    b, hq, d = q.shape
    hkv, s_max = k_cache.shape[1], k_cache.shape[2]
    tile = tile_config(d)
    block_n = block_n or tile["block_n"]
    num_sms = sm_count(q.device)
    if num_splits is not None:
        source = "override"
    elif workspace is not None:
        num_splits, source = workspace.num_splits, "workspace"
    else:
        num_splits, source = _split_heuristic(num_sms, b, hkv, s_max, block_n), "heuristic"
    combine_block_d = combine_block_d or _combine_block_d(d, num_splits)
    return {
        "kernel": "triton-flash-decode",
        "num_splits": num_splits,
        "splits_from": source,
        "block_n": block_n,
        "num_warps": num_warps or tile["num_warps"],
        "num_stages": num_stages or tile["num_stages"],
        "combine_block_d": combine_block_d,
        "combine_warps": combine_warps or _combine_warps(num_splits, combine_block_d),
        "pdl": pdl_supported(q.device) if pdl is None else bool(pdl) and q.is_cuda,
        "pdl_wait": (PDL_WAIT_DEFAULT and pdl_supported(q.device))
        if pdl_wait is None
        else bool(pdl_wait) and q.is_cuda,
        "gqa_rows": max(_GROUP_ROWS, triton.next_power_of_2(hq // hkv)),
        "num_sms": num_sms,
    }


def _combine_block_s(splits: int) -> int:
    """Splits the combine merges per step: all of them at once up to 64."""
    return min(triton.next_power_of_2(splits), 64)


def _combine_block_d(head_dim: int, splits: int) -> int:
    """Head-dim slice of a combine program: 16 wide when it merges 16 or more splits a step, else 32."""
    return min(head_dim, 16 if _combine_block_s(splits) >= _COMBINE_WIDE_SPLITS else 32)


def _combine_warps(splits: int, block_d: int) -> int:
    """One warp, or 8 for an overridden slice that merges more than 2048 values a step."""
    return _COMBINE_WARPS if _combine_block_s(splits) * block_d <= 2048 else 8


@functools.cache
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; a nominal 8 elsewhere (the interpreter), so splits still vary."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether the combine can launch early (programmatic dependent launch): Hopper+ and a Triton with gdc_*."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    try:  # recent Triton APIs (3.6 and 3.9 have them); without them the combine just launches after
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda as tl_cuda
    except ImportError:
        return False
    return hasattr(tl_cuda, "gdc_wait") and "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def _interpreting() -> bool:
    # Triton's own launcher reads the same flag on every launch; it selects no setting of ours
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def unsupported_reasons(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor
) -> list[str]:
    """Why `flash_decode` cannot take these inputs; empty when it can."""
    reasons = input_reasons(q, k_cache, v_cache, lengths, HEAD_DIMS, MAX_GQA_RATIO)
    if not well_formed(q, k_cache) or not one_device(q, k_cache, v_cache, lengths):
        return reasons
    if q.device.type == "cuda":
        if torch.cuda.get_device_capability(q.device) < (8, 0):
            reasons.append("CUDA device below compute capability 8.0 (bf16 tl.dot)")
    elif not _interpreting():
        reasons.append(f"device {q.device.type} is not CUDA and the Triton interpreter is off")
    return reasons


def flash_decode(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int32 on q's device, 1 <= lengths[b] <= S_max
    scale: float,
    *,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,  # [B, Hq, D] in q's dtype
    workspace: FlashDecodeWorkspace | None = None,
    **tuning: Unpack[Tuning],  # block_n, num_warps, num_stages, pdl, combine_block_d: for tuning experiments
) -> torch.Tensor:  # [B, Hq, D]
    """One-token GQA attention over the first lengths[b] cache positions (split-KV).

    Splits: `num_splits`, else the workspace's, else the heuristic for S_max (see `decode_config`).
    """
    b, hq, d = q.shape
    cfg = _resolve(q, k_cache, num_splits, workspace, **tuning)
    if workspace is None:
        workspace = FlashDecodeWorkspace.allocate(b, hq, d, cfg["num_splits"], q.device)
    elif (
        workspace.acc.shape[0] < b
        or workspace.acc.shape[1] != hq
        or workspace.num_splits < cfg["num_splits"]
        or workspace.acc.shape[3] != d
    ):
        raise ValueError(f"workspace {tuple(workspace.acc.shape)} does not fit B={b} Hq={hq} D={d} {cfg}")
    if out is None:
        out = torch.empty_like(q)
    _launch(q, k_cache, v_cache, lengths, scale, out, workspace, cfg)
    return out


def _launch(q, k_cache, v_cache, lengths, scale, out, workspace, cfg, trace=None):
    # returns the compiled kernels (None under the interpreter), for the benchmark's resource report
    partial = _launch_partial(q, k_cache, v_cache, lengths, scale, out, workspace, cfg, trace)
    if cfg["num_splits"] == 1:  # nothing to merge: the partial kernel wrote the output itself
        return partial, None
    rows = cfg["num_splits"] * q.shape[0] * k_cache.shape[1]  # the partial kernel's trace rows come first
    return partial, _launch_combine(q, out, workspace, cfg, None if trace is None else trace[rows:])


def _launch_partial(q, k_cache, v_cache, lengths, scale, out, ws, cfg, trace=None):
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    splits = cfg["num_splits"]
    interpret = _interpreting()
    partial_kernel, _ = _kernels(interpret)
    direct = splits == 1  # nothing to merge: the partial kernel writes the output itself
    return partial_kernel[(splits, b * hkv)](
        q, k_cache, v_cache, lengths, ws.m, ws.lsum, ws.acc, out, ws.m if trace is None else trace,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ws.m.stride(0), ws.m.stride(1), ws.m.stride(2),
        ws.acc.stride(0), ws.acc.stride(1), ws.acc.stride(2),
        out.stride(0), out.stride(1),
        hkv, k_cache.shape[2], splits,
        G=group, G_PAD=max(_GROUP_ROWS, triton.next_power_of_2(group)), D=d, BLOCK_N=cfg["block_n"],
        DOT_F32=interpret, PDL=cfg["pdl"] and not direct, DIRECT=direct, PDL_WAIT=cfg["pdl_wait"],
        TRACE=trace is not None,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **({"launch_pdl": True} if cfg["pdl_wait"] else {}),
    )  # fmt: skip


def _launch_combine(q, out, ws, cfg, trace=None):
    b, hq, d = q.shape
    splits = cfg["num_splits"]
    _, combine_kernel = _kernels(_interpreting())
    block_d = cfg["combine_block_d"]  # a slice of D per program: more programs hide the L2 latency
    block_s = _combine_block_s(splits)
    return combine_kernel[(b * hq, d // block_d)](
        ws.m, ws.lsum, ws.acc, out, ws.m if trace is None else trace,
        ws.m.stride(0), ws.m.stride(1), ws.m.stride(2),
        ws.acc.stride(0), ws.acc.stride(1), ws.acc.stride(2),
        out.stride(0), out.stride(1),
        hq, splits,
        BLOCK_D=block_d, BLOCK_S=block_s,
        PDL=cfg["pdl"], TRACE=trace is not None,
        num_warps=cfg["combine_warps"],
        **({"launch_pdl": True} if cfg["pdl"] else {}),
    )  # fmt: skip


@functools.cache
def _kernels(interpret: bool):  # the mode is only the cache key
    # triton.jit picks the interpreter or the compiler when it wraps a function, so wrap on first use.
    return triton.jit(_partial), triton.jit(_combine)


def _partial(
    Q,  # [B, Hq, D] queries; strides (stride_qb, stride_qh, 1)
    K,  # [B, Hkv, S_max, D] key cache; strides (stride_kb, stride_kh, stride_kn, 1)
    V,  # [B, Hkv, S_max, D] value cache; strides (stride_vb, stride_vh, stride_vn, 1)
    Lengths,  # [B] int32 valid positions per sequence
    M,  # [B, Hq, S] fp32 out: max scaled score per split (natural log units), -inf when empty
    Lsum,  # [B, Hq, S] fp32 out: sum of exp(score - M) per split, 0 when empty
    Acc,  # [B, Hq, S, D] fp32 out: sum of exp(score - M) * v per split, 0 when empty
    Out,  # [B, Hq, D] output in q's dtype, written here only when DIRECT; strides (stride_ob, stride_oh, 1)
    Trace,  # int64 [programs, TRACE_FIELDS] when TRACE (see TRACE_FIELDS)
    qk_scale,  # softmax scale * log2(e): scores are kept in base 2 inside the loop
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb, stride_mh, stride_ms,
    stride_ab, stride_ah, stride_as,
    stride_ob, stride_oh,
    num_kv_heads, s_max, num_splits,
    G: tl.constexpr,  # query heads per KV head
    G_PAD: tl.constexpr,  # G rounded up to a power of two >= 16 (tl.dot's smallest M)
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,  # fp32 dot operands (same rounding of p): the interpreter's bf16 tl.dot is wrong
    PDL: tl.constexpr,  # let the combine kernel launch early (programmatic dependent launch)
    DIRECT: tl.constexpr,  # one split: normalise and write Out, no partials
    PDL_WAIT: tl.constexpr,  # launched early: wait for the previous kernel's writes before reading
    TRACE: tl.constexpr,  # write this program's timeline to Trace (bench --timeline)
):  # fmt: skip
    if TRACE:
        t_start = tl.extra.cuda.globaltimer()
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    if TRACE:
        t_wait = tl.extra.cuda.globaltimer()
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_kv_heads
    h = bh % num_kv_heads

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = h * G + offs_g
    in_group = offs_g < G
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)

    # Split s takes the tiles s, s + S, s + 2S, ... of this sequence's own length, so a short sequence
    # in a batch captured for a long one still spreads over all its programs (splits past its last
    # tile are empty). Interleaved, not contiguous runs: on the H200 0.2-1.0 us faster at 4k-32k,
    # batch 1 (the slowest program of a call ends sooner; docs/results/*2026-11-30e*).
    length = tl.minimum(tl.load(Lengths + b), s_max)  # a bad length must not read past the cache
    if TRACE:  # the timer read waits for the length (a register input of the asm)
        t_len = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l,r", [length], dtype=tl.int64, is_pure=False, pack=1
        )
    q = tl.load(
        Q + b64 * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=in_group[:, None], other=0.0
    )
    if DOT_F32:
        q = q.to(tl.float32)
    k_ptrs = K + b64 * stride_kb + h64 * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + b64 * stride_vb + h64 * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    if TRACE:
        t_loop = tl.extra.cuda.globaltimer()
    for n0 in range(split * BLOCK_N, length, num_splits * BLOCK_N):
        valid = (n0 + offs_n) < length
        k = tl.load(k_ptrs + n0 * stride_kn, mask=valid[:, None], other=0.0)
        v = tl.load(v_ptrs + n0 * stride_vn, mask=valid[:, None], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [G_PAD, BLOCK_N], base-2 logits
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a valid position
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(V.dtype.element_ty).to(v.dtype), v)
        m_i = m_new

    if DIRECT:
        o_ptrs = Out + b64 * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=in_group[:, None])
    else:
        ml_off = b64 * stride_mb + heads * stride_mh + split * stride_ms
        tl.store(M + ml_off, m_i * 0.6931471805599453, mask=in_group)  # base 2 -> natural log units
        tl.store(Lsum + ml_off, l_i, mask=in_group)
        a_ptrs = Acc + b64 * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :]
        tl.store(a_ptrs, acc, mask=in_group[:, None])
    if TRACE:
        row = Trace + (bh * num_splits + split).to(tl.int64) * TRACE_FIELDS
        tl.store(row, t_start)
        tl.store(row + 1, t_loop)
        tl.store(row + 2, tl.extra.cuda.globaltimer())
        tl.store(row + 3, tl.extra.cuda.smid().to(tl.int64))
        tl.store(row + 4, t_wait)
        tl.store(row + 5, t_len)


def _combine(
    M,  # [B, Hq, S] fp32 per-split max (natural log units), -inf for an empty split
    Lsum,  # [B, Hq, S] fp32 per-split sum of exp(score - M), 0 for an empty split
    Acc,  # [B, Hq, S, D] fp32 per-split unnormalised output, 0 for an empty split
    Out,  # [B, Hq, D] output in q's dtype; strides (stride_ob, stride_oh, 1)
    Trace,  # int64 [programs, TRACE_FIELDS] after the partial kernel's rows, when TRACE (see TRACE_FIELDS)
    stride_mb, stride_mh, stride_ms,
    stride_ab, stride_ah, stride_as,
    stride_ob, stride_oh,
    num_heads, num_splits,
    BLOCK_D: tl.constexpr,  # head-dim slice per program: more programs to hide the L2 latency
    BLOCK_S: tl.constexpr,  # splits merged per step; one step (all loads in flight at once) when S <= BLOCK_S
    PDL: tl.constexpr,  # launched early: wait for the partial kernel's writes before reading them
    TRACE: tl.constexpr,  # write this program's timeline to Trace (bench --timeline)
):  # fmt: skip
    if TRACE:
        t_start = tl.extra.cuda.globaltimer()
    bh = tl.program_id(0)
    b = (bh // num_heads).to(tl.int64)
    h = (bh % num_heads).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m_ptrs = M + b * stride_mb + h * stride_mh + offs_s * stride_ms
    l_ptrs = Lsum + b * stride_mb + h * stride_mh + offs_s * stride_ms
    a_ptrs = Acc + b * stride_ab + h * stride_ah + offs_s[:, None] * stride_as + offs_d[None, :]
    if PDL:
        tl.extra.cuda.gdc_wait()
    if TRACE:
        t_wait = tl.extra.cuda.globaltimer()

    # Lane-wise online merge: lane i folds in splits i, i + BLOCK_S, ...; the lanes merge at the end.
    m_run = tl.full([BLOCK_S], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_S], tl.float32)
    acc_run = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        in_range = (s0 + offs_s) < num_splits
        m = tl.load(m_ptrs + s0 * stride_ms, mask=in_range, other=float("-inf"))
        lsum = tl.load(l_ptrs + s0 * stride_ms, mask=in_range, other=0.0)
        a = tl.load(a_ptrs + s0 * stride_as, mask=in_range[:, None], other=0.0)
        m_new = tl.maximum(m_run, m)
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf for empty lanes
        alpha = tl.exp(m_run - base)
        beta = tl.exp(m - base)
        l_run = l_run * alpha + beta * lsum
        acc_run = acc_run * alpha[:, None] + beta[:, None] * a
        m_run = m_new
    m_max = tl.max(m_run, 0)
    if TRACE:  # the timer read waits for the maxima (the partials' first loads, reduced)
        t_loaded = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l,f", [m_max], dtype=tl.int64, is_pure=False, pack=1
        )
    w = tl.exp(m_run - m_max)  # lanes that only saw empty splits weigh 0
    out = tl.sum(w[:, None] * acc_run, 0) / tl.sum(w * l_run, 0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty))
    if TRACE:
        row = Trace + (bh * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * TRACE_FIELDS
        tl.store(row, t_start)
        tl.store(row + 1, t_wait)
        tl.store(row + 2, tl.extra.cuda.globaltimer())
        tl.store(row + 3, tl.extra.cuda.smid().to(tl.int64))
        tl.store(row + 4, t_loaded)
