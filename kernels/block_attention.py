"""Row-invariant attention for a block of query rows per sequence: decode and speculative verify alike.

Lossless speculation in bf16 needs the verify pass (up to B new rows) and plain decode (one row) to give
the same bits for the same position. Here every query row's result depends on its own query, its own
length and the cache, and on nothing else:

- the KV range is cut at fixed multiples of `split` positions (a session constant, never the row count
  or the length of another row), a split's program walks its tiles in order, and the combine merges a
  row's splits 0 .. ceil(L / split) - 1 one after the other;
- the tile's row dimension is the block's (``rows``: the most rows a caller ever passes, times the GQA
  group, padded for ``tl.dot``), not how many rows are real, so the same instructions compute a row
  whether it is alone or one of seven;
- a tile past a row's length is masked for that row to an exact no-op (a factor of exactly 1 and a
  contribution of exactly 0), and a split past it is never merged, so the work other rows need leaves
  it alone.

One program per (split, sequence, KV head) holds all the query heads of its KV head for every row (the
K/V tile is read once for all of them) and writes its running (max, sum, unnormalised output) to fp32
scratch; a combine program per (sequence, KV head, row) merges them. Lengths are read on the device and
the grid depends on host ints only, so a launch can be captured in a CUDA graph.

`block_attention_torch` is the same contract in plain PyTorch (a row at a time, every call the same
shape), the path on the CPU.
"""

from __future__ import annotations

import functools
import math

import torch

BLOCK_N = 64  # positions per K/V tile
_MIN_ROWS = 16  # smallest M that tl.dot accepts
LOG2E = 1.4426950408889634


def tile_rows(block: int, group: int) -> int:
    """The tile's row dimension for blocks of up to `block` query rows and a GQA group of `group` heads."""
    return max(_MIN_ROWS, 1 << max(0, math.ceil(math.log2(block * group))))


def split_size(max_seq: int, batch: int, n_kv: int, num_sms: int, block_n: int = BLOCK_N) -> int:
    """Positions per split for a cache of max_seq positions: about one program per SM at full length.

    A pure function of the session's constants, so a row's arrangement never depends on how many rows
    are computed with it or how long they are.
    """
    splits = max(1, num_sms // max(1, batch * n_kv))
    per = -(-max_seq // splits)
    return max(block_n, -(-per // block_n) * block_n)


@functools.cache
def _kernels(interpret: bool):
    import triton
    import triton.language as tl

    @triton.jit
    def partial(
        Q, K, V, LEN, M_OUT, L_OUT, ACC_OUT,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_s, sk_d,
        sv_b, sv_h, sv_s, sv_d,
        slen_b, sw_bh, sw_s, sa_bh, sa_s, sa_r,
        n_kv, n_real, scale_log2,
        G: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
    ):  # fmt: skip
        pid_s = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // n_kv
        h = pid_bh % n_kv
        r = tl.arange(0, ROWS)  # row r = t * G + g: query row t, head h * G + g
        t = r // G
        g = r % G
        real = t < n_real
        lens = tl.load(LEN + b * slen_b + t, mask=real, other=0)  # [ROWS]
        max_len = tl.max(lens, 0)
        start = pid_s * SPLIT
        if start < max_len:
            d = tl.arange(0, D)
            q_ptr = Q + b * sq_b + (h * G + g)[:, None] * sq_h + t[:, None] * sq_t + d[None, :] * sq_d
            q = tl.load(q_ptr, mask=real[:, None], other=0.0)
            m_i = tl.full([ROWS], float("-inf"), tl.float32)
            l_i = tl.zeros([ROWS], tl.float32)
            acc = tl.zeros([ROWS, D], tl.float32)
            end = tl.minimum(start + SPLIT, max_len)
            for n0 in range(start, end, BLOCK):
                n = n0 + tl.arange(0, BLOCK)
                inside = n < max_len
                k_ptr = K + b * sk_b + h * sk_h + n[None, :] * sk_s + d[:, None] * sk_d
                k = tl.load(k_ptr, mask=inside[None, :], other=0.0)  # [D, BLOCK]
                s = tl.dot(q, k) * scale_log2  # [ROWS, BLOCK], log2 units
                s = tl.where(n[None, :] < lens[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                # a row with nothing valid yet keeps -inf; rescale from 0 so that no inf - inf appears
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_ref)
                p = tl.exp2(s - m_ref[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v_ptr = V + b * sv_b + h * sv_h + n[:, None] * sv_s + d[None, :] * sv_d
                v = tl.load(v_ptr, mask=inside[:, None], other=0.0)  # [BLOCK, D]
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            w = pid_bh * sw_bh + pid_s * sw_s + r
            tl.store(M_OUT + w, m_i)
            tl.store(L_OUT + w, l_i)
            a_ptr = ACC_OUT + pid_bh * sa_bh + pid_s * sa_s + r[:, None] * sa_r + d[None, :]
            tl.store(a_ptr, acc)

    @triton.jit
    def combine(
        M_IN, L_IN, ACC_IN, LEN, OUT,
        slen_b, sw_bh, sw_s, sa_bh, sa_s, sa_r,
        so_b, so_h, so_t, so_d,
        n_kv, n_real,
        G: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
    ):  # fmt: skip
        pid_bh = tl.program_id(0)
        r = tl.program_id(1)
        b = pid_bh // n_kv
        h = pid_bh % n_kv
        t = r // G
        g = r % G
        d = tl.arange(0, D)
        o_ptr = OUT + b * so_b + (h * G + g) * so_h + t * so_t + d * so_d
        if t < n_real:
            length = tl.load(LEN + b * slen_b + t)
            n_splits = (length + SPLIT - 1) // SPLIT
            m = tl.full([], float("-inf"), tl.float32)
            lsum = tl.zeros([], tl.float32)
            acc = tl.zeros([D], tl.float32)
            for s in range(0, n_splits):  # in order: the same sums for the same length, always
                w = pid_bh * sw_bh + s * sw_s + r
                m_s = tl.load(M_IN + w)
                l_s = tl.load(L_IN + w)
                a_s = tl.load(ACC_IN + pid_bh * sa_bh + s * sa_s + r * sa_r + d)
                m_new = tl.maximum(m, m_s)
                c_old = tl.exp2(m - m_new)
                c_new = tl.exp2(m_s - m_new)
                acc = acc * c_old + a_s * c_new
                lsum = lsum * c_old + l_s * c_new
                m = m_new
            tl.store(o_ptr, (acc / lsum).to(OUT.dtype.element_ty))
        else:  # a padding row: zeros, so that what follows sees finite values
            tl.store(o_ptr, tl.zeros([D], tl.float32).to(OUT.dtype.element_ty))

    return partial, combine


def unsupported_reasons(q: torch.Tensor, k_cache: torch.Tensor) -> list[str]:
    """Why the Triton kernel cannot take these inputs (empty: it can)."""
    why = []
    if q.shape[-1] not in (64, 128, 256):
        why.append(f"head dim {q.shape[-1]} is not 64, 128 or 256")
    if q.shape[1] % k_cache.shape[1]:
        why.append(f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[1]} KV heads")
    try:
        import triton  # noqa: F401
    except ImportError:
        why.append("triton is not installed")
    return why


def block_attention(
    q: torch.Tensor,  # [B, Hq, T, D]: T rows per sequence, the first n_real of them real
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B, T] int32 on q's device: valid positions for each row (its own included)
    scale: float,
    n_real: int,
    split: int,
    rows: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:  # [B, Hq, T, D]; rows n_real.. are zeros
    """Row-invariant GQA attention of n_real query rows per sequence (Triton)."""
    b, hq, t, d = q.shape
    hkv, s_max = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    if not 1 <= n_real <= t:
        raise ValueError(f"n_real must be in 1..{t}, got {n_real}")
    if split % BLOCK_N:
        raise ValueError(f"split {split} is not a multiple of the tile ({BLOCK_N} positions)")
    rows = rows or tile_rows(t, g)
    if rows < t * g:
        raise ValueError(f"rows {rows} cannot hold {t} rows of {g} heads")
    n_splits = -(-s_max // split)
    m = torch.empty(b * hkv, n_splits, rows, dtype=torch.float32, device=q.device)
    lsum = torch.empty_like(m)
    acc = torch.empty(b * hkv, n_splits, rows, d, dtype=torch.float32, device=q.device)
    out = torch.empty(b, hq, t, d, dtype=q.dtype, device=q.device)
    lengths = lengths.to(torch.int32)
    partial, combine = _kernels(_interpreting())
    partial[(n_splits, b * hkv)](
        q, k_cache, v_cache, lengths, m, lsum, acc,
        *q.stride(), *k_cache.stride(), *v_cache.stride(),
        lengths.stride(0), m.stride(0), m.stride(1), acc.stride(0), acc.stride(1), acc.stride(2),
        hkv, n_real, scale * LOG2E,
        G=g, ROWS=rows, D=d, BLOCK=BLOCK_N, SPLIT=split, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    combine[(b * hkv, t * g)](
        m, lsum, acc, lengths, out,
        lengths.stride(0), m.stride(0), m.stride(1), acc.stride(0), acc.stride(1), acc.stride(2),
        *out.stride(), hkv, n_real,
        G=g, D=d, SPLIT=split, num_warps=1,
    )  # fmt: skip
    return out


def block_attention_torch(
    q: torch.Tensor,  # [B, Hq, T, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,
    lengths: torch.Tensor,  # [B, T]
    scale: float,
    n_real: int,
) -> torch.Tensor:  # [B, Hq, T, D]; rows n_real.. are zeros
    """The same contract in PyTorch: each real row alone through `reference.decode_attention`, whose
    every call has the same shapes, so a row's bits do not depend on the rows beside it."""
    from kernels import reference

    out = torch.zeros_like(q)
    for i in range(n_real):
        out[:, :, i] = reference.decode_attention(q[:, :, i], k_cache, v_cache, lengths[:, i], scale)
    return out


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"
