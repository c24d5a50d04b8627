"""engine.quants.dequantize must be bit-exact with gguf-py's numpy reference, on real and synthetic data."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine import quants
from engine.quants import SUPPORTED, UnsupportedTensorType, dequantize
from evalbot.reference.registry import cached_path

T = gguf.GGMLQuantizationType

# torch warns when handed read-only numpy memory; dequantize must never do that.
pytestmark = pytest.mark.filterwarnings("error::UserWarning")

REAL_TYPES = [T.F32, T.Q5_0, T.Q8_0, T.Q6_K, T.Q4_K]
QUANTIZABLE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Byte offsets of each block's fp16 scale fields: random bytes there could be inf/NaN, whose products
# are not worth pinning down, so tests overwrite them with finite values.
FP16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


@pytest.fixture(scope="module")
def model_path() -> Path:
    path = cached_path("qwen2.5-coder-0.5b")
    if not path.is_file():
        pytest.skip(
            f"model not cached at {path} (python -m evalbot.reference.registry fetch qwen2.5-coder-0.5b)"
        )
    return path


@pytest.fixture(scope="module")
def reader(model_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(model_path)


def logical_shape(tensor: gguf.ReaderTensor) -> tuple[int, ...]:
    return tuple(reversed(tensor.shape.tolist()))


def assert_bit_exact(got: torch.Tensor, expected: np.ndarray) -> None:
    assert got.dtype == torch.float32 and got.is_contiguous()
    assert tuple(got.shape) == expected.shape
    assert np.array_equal(got.numpy().view(np.uint32), expected.astype(np.float32).view(np.uint32))


def read_only(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.flags.writeable = False
    return array


def test_supported_types() -> None:
    assert {T.F32, T.F16, T.BF16, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K} <= SUPPORTED
    assert set(FP16_FIELDS) | {T.F32, T.F16, T.BF16} == SUPPORTED


@pytest.mark.slow
@pytest.mark.parametrize("qtype", REAL_TYPES, ids=lambda t: t.name)
def test_real_tensor_rows_match_gguf_py(reader: gguf.GGUFReader, qtype: T) -> None:
    tensor = next((t for t in reader.tensors if t.tensor_type == qtype and t.data.ndim > 1), None)
    tensor = tensor or next(t for t in reader.tensors if t.tensor_type == qtype)
    shape = logical_shape(tensor)
    data = tensor.data[:64] if tensor.data.ndim > 1 else tensor.data
    shape = (data.shape[0], *shape[1:]) if len(shape) > 1 else shape
    before = data.tobytes()

    got = dequantize(data, qtype, shape, tensor.name)

    assert_bit_exact(got, gguf.quants.dequantize(data, qtype).reshape(shape))
    assert data.tobytes() == before


@pytest.mark.slow
def test_real_whole_tensor_spanning_many_chunks(reader: gguf.GGUFReader) -> None:
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    shape = logical_shape(tensor)

    got = dequantize(tensor.data, tensor.tensor_type, shape, tensor.name)

    assert tuple(got.shape) == shape == (896, 4864)
    for rows in (slice(0, 48), slice(400, 448), slice(848, 896)):
        expected = gguf.quants.dequantize(tensor.data[rows], tensor.tensor_type)
        assert_bit_exact(got[rows].contiguous(), expected)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_quantized_random_data_matches_gguf_py(qtype: T) -> None:
    rng = np.random.default_rng(qtype.value)
    rows, cols = 24, 512
    scale = np.exp(rng.uniform(-6, 3, size=(rows, 1)))
    values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    values[0, :7] = [0.0, -0.0, 1e-8, -1e-8, 3e4, -3e4, 1.0]
    # The reader hands F16 out as a typed float16 array and BF16 as (rows, 2 * cols) bytes; quantize()
    # returns exactly those layouts.
    data = read_only(gguf.quants.quantize(values, qtype))

    got = dequantize(data, qtype, (rows, cols))

    assert_bit_exact(got, gguf.quants.dequantize(data, qtype).reshape(rows, cols))


def test_f32_is_copied_not_aliased() -> None:
    values = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    data = read_only(values)

    got = dequantize(data, T.F32, (3, 8))

    assert_bit_exact(got, values)
    got.fill_(0)
    assert np.array_equal(data, values)


@pytest.mark.parametrize("qtype", sorted(FP16_FIELDS, key=lambda t: t.value), ids=lambda t: t.name)
def test_random_blocks_match_gguf_py_across_chunk_edges(qtype: T, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bit pattern of every field, a 3-D shape, and chunk edges that fall inside rows."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(qtype.value)
    outer, rows, blocks_per_row = 3, 5, 3
    raw = rng.integers(0, 256, size=(outer, rows, blocks_per_row, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype]:
        finite = rng.standard_normal((outer, rows, blocks_per_row, 1)).astype(np.float16)
        raw[..., offset : offset + 2] = finite.view(np.uint8)
    data = read_only(raw.reshape(outer, rows, blocks_per_row * type_size))
    shape = (outer, rows, blocks_per_row * block_size)
    monkeypatch.setattr(quants, "_CHUNK_VALUES", 2 * block_size)

    got = dequantize(data, qtype, shape)

    assert_bit_exact(got, gguf.quants.dequantize(data, qtype).reshape(shape))


def test_unsupported_type_is_named() -> None:
    data = np.zeros((2, gguf.GGML_QUANT_SIZES[T.IQ2_XXS][1]), dtype=np.uint8)

    with pytest.raises(UnsupportedTensorType, match="IQ2_XXS") as info:
        dequantize(data, T.IQ2_XXS, (2, 256), "blk.3.ffn_up.weight")

    message = str(info.value)
    assert "blk.3.ffn_up.weight" in message
    assert all(t.name in message for t in SUPPORTED)


def test_unknown_type_number_is_unsupported() -> None:
    with pytest.raises(UnsupportedTensorType, match="999"):
        dequantize(np.zeros(4, dtype=np.uint8), 999, (4,))


def test_wrong_byte_size_is_rejected() -> None:
    data = np.zeros((3, 34), dtype=np.uint8)

    with pytest.raises(ValueError, match=r"Q8_0 data has 102 bytes but shape \(4, 32\) needs 136"):
        dequantize(data, T.Q8_0, (4, 32), "output.weight")


def test_wrong_typed_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="F16 data has 8 bytes"):
        dequantize(np.zeros(4, dtype=np.float16), T.F16, (5,))


def test_row_not_a_whole_number_of_blocks_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a multiple of the Q4_K block size 256"):
        dequantize(np.zeros((2, 144), dtype=np.uint8), T.Q4_K, (1, 384))


@pytest.mark.parametrize(
    "qtype", [T.F32, T.F16, *sorted(FP16_FIELDS, key=lambda t: t.value)], ids=lambda t: t.name
)
def test_out_receives_the_same_bits(qtype: T) -> None:
    """With `out` (rows of a bigger tensor) the values land there, bit for bit as without it, and
    nothing around them is touched."""
    rng = np.random.default_rng(7)
    if qtype in FP16_FIELDS:  # random blocks with finite scales, as above
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(4, 256 // block_size, type_size), dtype=np.uint8)
        for offset in FP16_FIELDS[qtype]:
            finite = rng.standard_normal((4, 256 // block_size, 1)).astype(np.float16)
            raw[..., offset : offset + 2] = finite.view(np.uint8)
        data = read_only(raw.reshape(4, -1))
    else:
        values = rng.standard_normal((4, 256)).astype(np.float32)
        data = read_only(values if qtype == T.F32 else gguf.quants.quantize(values, qtype))
    want = dequantize(data, qtype, (4, 256))
    big = torch.full((10, 256), 7.0)
    got = dequantize(data, qtype, (4, 256), out=big[3:7])
    assert got.data_ptr() == big[3:7].data_ptr()
    assert_bit_exact(big[3:7], want.numpy())
    assert torch.all(big[:3] == 7.0) and torch.all(big[7:] == 7.0)


def test_out_of_the_wrong_kind_is_refused() -> None:
    data = read_only(gguf.quants.quantize(np.ones((2, 32), np.float32), T.Q8_0))
    for bad in (torch.empty(2, 31), torch.empty(2, 32, dtype=torch.float64), torch.empty(32, 2).t()):
        with pytest.raises(ValueError, match="out must be a contiguous float32"):
            dequantize(data, T.Q8_0, (2, 32), out=bad)
