"""Vectorized PyTorch dequantization of GGUF tensor data, bit-exact with ``gguf.quants.dequantize``.

``dequantize`` takes the raw ``ReaderTensor.data`` of a tensor (a read-only memmap view), copies its bytes a
chunk of blocks at a time into torch, unpacks the block fields (fp16 scales, packed 4/5/6/8-bit quants) with
whole-chunk tensor ops, and writes float32 values into one preallocated output. The float32 operations run in
the same order as gguf-py's numpy reference (e.g. Q4_K computes ``d * sc`` and ``dmin * m`` first, then
``d * q - dm``, never fused), so every value is bit-identical to it, while running multithreaded and in C.
The quants are widened into the output first and scaled there in place, the broadcast scale always the
second operand: ``torch.mul(d, q)`` with the (n, 1) scale first took 5x as long per value on one thread
(the product is the same bits either way: IEEE multiplication commutes).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_T = GGMLQuantizationType

# About 2**20 output values per chunk: large enough that per-op overhead is negligible, small enough that
# the handful of chunk-sized temporaries stay in the tens of megabytes even for the 151936 x 896 embedding.
_CHUNK_VALUES = 1 << 20


class UnsupportedTensorType(ValueError):
    """A tensor's GGML type has no dequantizer here."""


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    # Reinterpreting a strided byte slice as a wider dtype depends on stride and offset alignment; copying the
    # two bytes out first (a tiny fraction of each block) removes that dependency. The (n_blocks, 1) result
    # broadcasts over the block's values.
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, g, L) packed bytes -> (n, g, 2, L): low nibbles first, then high nibbles, as ggml stores them."""
    shifts = torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 2, 1)
    return (qs.unsqueeze(2) >> shifts) & 0x0F


def _bits(qh: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """(n, g, L) bytes -> (n, g, count, L): the count fields of `width` bits of each byte, lowest first."""
    shifts = torch.arange(0, width * count, width, dtype=torch.uint8).view(1, 1, count, 1)
    return (qh.unsqueeze(2) >> shifts) & ((1 << width) - 1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) little-endian uint32 bytes -> (n, 32) bits, bit j of the word at column j."""
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 1, 8)
    return ((qh.unsqueeze(2) >> shifts) & 1).reshape(qh.shape[0], 32)


def _q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(blocks[:, 2:].view(torch.int8))  # int8 -> float32 is exact
    out.mul_(_f16(blocks, 0))


def _q4_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 2:].unsqueeze(1)).reshape(n, 32).view(torch.int8) - 8
    out.copy_(q)
    out.mul_(d)


def _q4_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    out.copy_(_nibbles(blocks[:, 4:].unsqueeze(1)).reshape(n, 32))
    out.mul_(d).add_(m)


def _q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    d = _f16(blocks, 0)
    ql = _nibbles(blocks[:, 6:].unsqueeze(1)).reshape(n, 32)
    out.copy_((ql | (_bits32(blocks[:, 2:6]) << 4)).view(torch.int8) - 16)
    out.mul_(d)


def _q5_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    ql = _nibbles(blocks[:, 8:].unsqueeze(1)).reshape(n, 32)
    out.copy_(ql | (_bits32(blocks[:, 4:8]) << 4))
    out.mul_(d).add_(m)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, as float32 (n, 8, 1)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float().unsqueeze(2), mn.float().unsqueeze(2)


def _q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d = _f16(blocks, 0).unsqueeze(2) * sc
    dm = _f16(blocks, 2).unsqueeze(2) * mn
    o = out.view(n, 8, 32)
    o.copy_(_nibbles(blocks[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32))
    o.mul_(d).sub_(dm)


def _q5_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d = _f16(blocks, 0).unsqueeze(2) * sc
    dm = _f16(blocks, 2).unsqueeze(2) * mn
    ql = _nibbles(blocks[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    qh = _bits(blocks[:, 16:48].unsqueeze(1), 1, 8).reshape(n, 8, 32)
    o = out.view(n, 8, 32)
    o.copy_(ql | (qh << 4))
    o.mul_(d).sub_(dm)


def _q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    scales = blocks[:, 192:208].view(torch.int8).float()
    d = (_f16(blocks, 208) * scales).unsqueeze(2)
    ql = _nibbles(blocks[:, :128].reshape(n, 2, 64)).reshape(n, 8, 32)
    qh = _bits(blocks[:, 128:192].reshape(n, 2, 32), 2, 4).reshape(n, 8, 32)
    q = (ql | (qh << 4)).view(torch.int8) - 32
    o = out.view(n, 16, 16)
    o.copy_(q.reshape(n, 16, 16))
    o.mul_(d)


def _bf16(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # bf16 is the top half of a float32, so widening is a 16-bit shift of the raw bits (as gguf-py does).
    bits = blocks.view(torch.int16).to(torch.int32) << 16
    out.copy_(bits.view(torch.float32).view(out.shape))


_BLOCK_KERNELS: dict[GGMLQuantizationType, Callable[[torch.Tensor, torch.Tensor], None]] = {
    _T.BF16: _bf16,
    _T.Q4_0: _q4_0,
    _T.Q4_1: _q4_1,
    _T.Q5_0: _q5_0,
    _T.Q5_1: _q5_1,
    _T.Q8_0: _q8_0,
    _T.Q4_K: _q4_k,
    _T.Q5_K: _q5_k,
    _T.Q6_K: _q6_k,
}

SUPPORTED: frozenset[GGMLQuantizationType] = frozenset({_T.F32, _T.F16, *_BLOCK_KERNELS})


def _label(name: str) -> str:
    return f"tensor {name!r}" if name else "tensor"


def _check_type(qtype: GGMLQuantizationType | int, name: str) -> GGMLQuantizationType:
    supported = ", ".join(t.name for t in sorted(SUPPORTED, key=lambda t: t.value))
    try:
        qtype = GGMLQuantizationType(qtype)
    except ValueError:
        raise UnsupportedTensorType(
            f"{_label(name)}: unknown GGML type {qtype!r} (supported: {supported})"
        ) from None
    if qtype not in SUPPORTED:
        raise UnsupportedTensorType(
            f"{_label(name)}: GGML type {qtype.name} is not supported (supported: {supported})"
        )
    return qtype


def dequantize(
    data: np.ndarray,
    qtype: GGMLQuantizationType,
    shape: tuple[int, ...],
    name: str = "",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantize a GGUF tensor's raw ``ReaderTensor.data`` to a contiguous float32 tensor of `shape`
    (numpy order, i.e. reversed ggml ne); the input is only read, never aliased by the result. With `out`
    (a contiguous float32 tensor of as many values, e.g. rows of a fused weight) the values are written
    there, and `out` comes back viewed as `shape`."""
    qtype = _check_type(qtype, name)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"{_label(name)}: negative dimension in shape {shape}")
    n_values = int(np.prod(shape, dtype=np.int64))
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    row = shape[-1] if shape else 1
    if row % block_size:
        raise ValueError(
            f"{_label(name)}: row length {row} of shape {shape} is not a multiple of the "
            f"{qtype.name} block size {block_size}"
        )
    n_blocks = n_values // block_size
    # Reinterpreting as bytes is free for the contiguous memmap views the reader hands out; only a strided
    # input pays for a copy here.
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size != n_blocks * type_size:
        raise ValueError(
            f"{_label(name)}: {qtype.name} data has {raw.size} bytes but shape {shape} needs "
            f"{n_blocks * type_size} ({n_blocks} blocks of {type_size} bytes)"
        )

    if out is not None and (out.dtype != torch.float32 or out.numel() != n_values or not out.is_contiguous()):
        raise ValueError(
            f"{_label(name)}: out must be a contiguous float32 tensor of {n_values} values, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    if qtype == _T.F32:
        values = torch.from_numpy(raw.view(np.float32).reshape(shape).copy())
        return values if out is None else out.view(shape).copy_(values)
    if qtype == _T.F16:
        # numpy's half -> single widening is exact and matches gguf-py, NaN payloads included.
        values = torch.from_numpy(raw.view(np.float16).astype(np.float32).reshape(shape))
        return values if out is None else out.view(shape).copy_(values)

    kernel = _BLOCK_KERNELS[qtype]
    out = torch.empty(n_values, dtype=torch.float32) if out is None else out.view(-1)
    step = max(1, _CHUNK_VALUES // block_size)
    for start in range(0, n_blocks, step):
        stop = min(start + step, n_blocks)
        # Copying one chunk of raw bytes (a fraction of the output's size) gives torch writable, owned
        # memory without ever aliasing the read-only memmap.
        blocks = torch.from_numpy(raw[start * type_size : stop * type_size].copy()).view(-1, type_size)
        kernel(blocks, out[start * block_size : stop * block_size].view(-1, block_size))
    return out.view(shape)
