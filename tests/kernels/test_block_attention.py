"""Row-invariant block attention (kernels/block_attention.py): parity with the reference, and a row's bits
independent of the rows beside it, in the Triton interpreter on the CPU (and on the GPU where there is one)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("needs triton", allow_module_level=True)

from tests.kernels.triton_interp import import_triton, run_in_fresh_interpreter

CUDA = torch.cuda.is_available()
INTERPRETER_READY = import_triton()

from kernels import block_attention as ba  # noqa: E402
from kernels import reference  # noqa: E402


@pytest.fixture(autouse=True)
def _kernels(monkeypatch, request):
    if CUDA or request.node.name == "test_kernels_in_fresh_interpreter":
        return
    if not INTERPRETER_READY:
        pytest.skip("triton was imported without the interpreter; see test_kernels_in_fresh_interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.skipif(CUDA or INTERPRETER_READY, reason="the kernel tests run in this process")
def test_kernels_in_fresh_interpreter():
    run_in_fresh_interpreter(__file__)


def _device() -> str:
    return "cuda" if CUDA else "cpu"


def _case(hq: int, hkv: int, d: int, s_max: int, t: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dev = _device()

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dev, dtype)

    return randn(1, hq, t, d), randn(1, hkv, s_max, d), randn(1, hkv, s_max, d)


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "start", "split"),
    [(4, 2, 64, 0, 64), (8, 2, 64, 130, 64), (4, 4, 64, 250, 128), (16, 8, 128, 70, 64)],
)
def test_every_real_row_matches_the_reference_and_padding_rows_are_zero(hq, hkv, d, start, split):
    t, n_real = 7, 5
    q, k, v = _case(hq, hkv, d, 320, t, torch.float32)
    lengths = (start + torch.arange(t) + 1)[None].int().to(q.device)
    out = ba.block_attention(q, k, v, lengths, d**-0.5, n_real, split)
    for i in range(n_real):
        want = reference.decode_attention(q[:, :, i].double(), k.double(), v.double(), lengths[:, i], d**-0.5)
        assert torch.allclose(out[:, :, i].double(), want, atol=2e-5, rtol=1e-4), i
    assert not out[:, :, n_real:].any()


def _numpy_dot_is_row_invariant() -> bool:
    """Whether numpy's matmul (the Triton interpreter's tl.dot) gives a row the same bits whatever rows sit
    beside it in the tile. OpenBLAS's SkylakeX kernels do; its Haswell and Zen kernels did not on a Zen 5
    VM (2026-12-04), so there the interpreter cannot show the GPU kernel's row invariance bit for bit."""
    rng = np.random.default_rng(0)
    for _ in range(8):
        a = rng.standard_normal((16, 64), dtype=np.float32)
        b = rng.standard_normal((64, 64), dtype=np.float32)
        for row in range(1, 16):
            alone = rng.standard_normal((16, 64), dtype=np.float32)
            alone[0] = a[row]
            if not np.array_equal(np.matmul(alone, b)[0], np.matmul(a, b)[row]):
                return False
    return True


def test_a_rows_bits_do_not_depend_on_its_slot_the_real_rows_or_their_lengths():
    """Decode (the row alone, slot 0, one real row) and verify (the row at slot i of seven) agree bit for bit,
    also when the cache past the row holds different values (padding rows write there). On the CPU the
    interpreter's tl.dot is numpy's matmul: where that is not row-invariant itself (some OpenBLAS kernels),
    the rows must agree to float32 accumulation error instead (the parallel suite showed 1e-6 relative), and
    the GPU run keeps the bit-for-bit check."""
    t, hq, hkv, d, split = 7, 8, 2, 64, 64
    q, k, v = _case(hq, hkv, d, 400, t, torch.float32, seed=1)
    start = 190  # the rows cross a split boundary (256) and a tile boundary
    lengths = (start + torch.arange(t) + 1)[None].int().to(q.device)
    verify = ba.block_attention(q, k, v, lengths, d**-0.5, t, split)
    for i in range(t):
        alone = torch.randn_like(q)  # whatever the padding rows hold
        alone[:, :, 0] = q[:, :, i]
        k2, v2 = k.clone(), v.clone()
        k2[:, :, start + i + 1 :] = torch.randn_like(k2[:, :, start + i + 1 :])  # past the row: other values
        v2[:, :, start + i + 1 :] = torch.randn_like(v2[:, :, start + i + 1 :])
        own = (start + i + torch.arange(t) + 1)[None].int().to(q.device)
        decode = ba.block_attention(alone, k2, v2, own, d**-0.5, 1, split)
        if q.is_cuda or _numpy_dot_is_row_invariant():
            assert torch.equal(decode[:, :, 0], verify[:, :, i]), i
        else:
            assert torch.allclose(decode[:, :, 0], verify[:, :, i], rtol=1e-4, atol=1e-5), i


def test_a_different_split_changes_the_bits_so_the_split_is_a_session_constant():
    # the guard's teeth: a row's arrangement is what makes the bits, so the session pins it
    t, hq, hkv, d = 3, 4, 2, 64
    q, k, v = _case(hq, hkv, d, 512, t, torch.float32, seed=2)
    lengths = (400 + torch.arange(t) + 1)[None].int().to(q.device)
    a = ba.block_attention(q, k, v, lengths, d**-0.5, t, 64)
    b = ba.block_attention(q, k, v, lengths, d**-0.5, t, 256)
    assert torch.allclose(a, b, atol=1e-5) and not torch.equal(a, b)


def test_the_torch_path_is_row_invariant_too():
    t, hq, hkv, d = 5, 4, 2, 64
    q, k, v = _case(hq, hkv, d, 200, t, torch.float32, seed=3)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    lengths = (100 + torch.arange(t) + 1)[None].int()
    verify = ba.block_attention_torch(q, k, v, lengths, d**-0.5, t)
    for i in range(t):
        alone = torch.zeros_like(q)
        alone[:, :, 0] = q[:, :, i]
        own = (100 + i + torch.arange(t) + 1)[None].int()
        assert torch.equal(ba.block_attention_torch(alone, k, v, own, d**-0.5, 1)[:, :, 0], verify[:, :, i])


def test_bad_arguments_are_refused():
    q, k, v = _case(4, 2, 64, 128, 4, torch.float32)
    n = torch.ones(1, 4, dtype=torch.int32, device=q.device)
    with pytest.raises(ValueError, match="n_real"):
        ba.block_attention(q, k, v, n, 0.1, 0, 64)
    with pytest.raises(ValueError, match="multiple of the tile"):
        ba.block_attention(q, k, v, n, 0.1, 2, 100)
    with pytest.raises(ValueError, match="cannot hold"):
        ba.block_attention(q, k, v, n, 0.1, 2, 64, rows=4)
    assert ba.unsupported_reasons(torch.empty(1, 4, 2, 48), torch.empty(1, 2, 8, 48))


def test_split_size_is_a_pure_function_of_the_session_constants():
    # about one program per SM at full length, whole tiles; never below one tile
    assert ba.split_size(4232, 1, 8, 132) == 320  # 16 splits x 8 KV heads = 128 programs at 4k
    assert ba.split_size(16520, 1, 8, 132) == 1088
    assert ba.split_size(100, 1, 8, 132) == 64
    assert ba.split_size(4232, 1, 8, 132) % ba.BLOCK_N == 0
    assert ba.tile_rows(7, 4) == 32 and ba.tile_rows(7, 2) == 16 and ba.tile_rows(1, 1) == 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("hq", "hkv", "s_max", "start"), [(32, 8, 4232, 4090), (16, 8, 16520, 16380)])
def test_on_the_gpu_bf16_parity_and_row_invariance_at_long_contexts(hq, hkv, s_max, start):
    t, d = 7, 128
    q, k, v = _case(hq, hkv, d, s_max, t, torch.bfloat16, seed=4)
    split = ba.split_size(s_max, 1, hkv, torch.cuda.get_device_properties(0).multi_processor_count)
    lengths = (start + torch.arange(t) + 1)[None].int().cuda()
    verify = ba.block_attention(q, k, v, lengths, d**-0.5, t, split)
    for i in range(t):
        want = reference.decode_attention(q[:, :, i].float(), k.float(), v.float(), lengths[:, i], d**-0.5)
        err = (verify[:, :, i].float() - want).norm() / want.norm()
        assert err < 5e-3, (i, err)
        alone = torch.zeros_like(q)
        alone[:, :, 0] = q[:, :, i]
        own = (start + i + torch.arange(t) + 1)[None].int().cuda()
        assert torch.equal(ba.block_attention(alone, k, v, own, d**-0.5, 1, split)[:, :, 0], verify[:, :, i])
