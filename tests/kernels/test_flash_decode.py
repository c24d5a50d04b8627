"""Split-KV flash-decode against the float64 PyTorch reference, on the GPU or in Triton's interpreter.

Without CUDA the kernels run in Triton's interpreter on CPU tensors. Triton decides whether its own
``tl`` helpers (``tl.max``, ``tl.cdiv``...) are interpreted when it is first imported, so this module
sets ``TRITON_INTERPRET`` just around that import and restores it; each kernel test then turns the
flag on for itself (monkeypatched, so it never leaks into other tests), and ``kernels.flash_decode``
wraps its kernels at call time under that flag. If something imported triton earlier in the same
pytest process, the in-process kernel tests skip and ``test_kernels_in_fresh_interpreter`` runs them
in a subprocess instead, so they are never silently lost. With CUDA they run compiled, and the
``gpu`` tests add real sizes and a CUDA-graph replay.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tests.kernels.triton_interp import import_triton, run_in_fresh_interpreter

CUDA = torch.cuda.is_available()
INTERPRETER_READY = import_triton()

from kernels import flash_decode as fd  # noqa: E402
from kernels.reference import decode_attention  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")
F16, BF16 = torch.float16, torch.bfloat16
# fp16 rounds p and the output to 11 bits; bf16 to 8, and the interpreter truncates instead of rounding
TOL = {F16: dict(rel=1e-3, atol=2e-3, rtol=2e-3), BF16: dict(rel=1e-2, atol=2e-2, rtol=2e-2)}


# The split kernels' oracle: flash-decode's partials and their merge, in float64 (kernels/reference.py
# holds the references the engine also runs; these are the tests' alone).


def decode_partials(
    q: torch.Tensor,  # [B, Hq, D]
    k: torch.Tensor,  # [B, Hkv, S_max, D]
    v: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int, valid positions per sequence (>= 1)
    scale: float,
    num_splits: int,
    block_n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # m, lsum [B, Hq, S]; acc [B, Hq, S, D]
    """Split-KV partials as flash-decode's first kernel defines them, in float64.

    Split s of sequence b takes the tiles s, s + num_splits, s + 2 * num_splits, ... of its
    ceil(len/block_n) tiles; an empty split is (m=-inf, lsum=0, acc=0). m is the max scaled score,
    lsum = sum exp(s - m), acc = sum exp(s - m) v.
    """
    b, hq, d = q.shape
    hkv = k.shape[1]
    qg = q.double().reshape(b, hkv, hq // hkv, d)
    m = torch.full((b, hq, num_splits), float("-inf"), dtype=torch.float64)
    lsum = torch.zeros(b, hq, num_splits, dtype=torch.float64)
    acc = torch.zeros(b, hq, num_splits, d, dtype=torch.float64)
    for i, n in enumerate(lengths.tolist()):
        split_of = (torch.arange(n) // block_n) % num_splits  # the split each position's tile belongs to
        for s in range(num_splits):
            positions = (split_of == s).nonzero()[:, 0]
            if not len(positions):
                continue
            scores = qg[i] @ k[i][:, positions].double().transpose(-1, -2) * scale  # [Hkv, G, P]
            mx = scores.amax(-1, keepdim=True)
            p = torch.exp(scores - mx)
            m[i, :, s] = mx.reshape(hq)
            lsum[i, :, s] = p.sum(-1).reshape(hq)
            acc[i, :, s] = (p @ v[i][:, positions].double()).reshape(hq, d)
    return m, lsum, acc


def combine_partials(
    m: torch.Tensor,  # [B, Hq, S] per-split max score, -inf for an empty split
    lsum: torch.Tensor,  # [B, Hq, S] per-split sum of exp(score - m)
    acc: torch.Tensor,  # [B, Hq, S, D] per-split sum of exp(score - m) * v
) -> torch.Tensor:  # [B, Hq, D] in acc's dtype
    """Merge split-KV partials with the log-sum-exp rescale; empty splits weigh nothing."""
    w = torch.exp(m - m.amax(-1, keepdim=True))  # [B, Hq, S]; 0 for empty splits
    used = m > float("-inf")
    num = torch.where(used[..., None], acc, 0).mul(w[..., None]).sum(-2)
    return num / (w * lsum).sum(-1, keepdim=True)


@pytest.fixture
def kernels(monkeypatch):
    """Run the Triton kernels: compiled on CUDA, else in the interpreter (when triton was imported for it)."""
    if CUDA:
        return
    if not INTERPRETER_READY:
        pytest.skip("triton was imported without the interpreter; see test_kernels_in_fresh_interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.skipif(CUDA or INTERPRETER_READY, reason="the kernel tests run in this process")
def test_kernels_in_fresh_interpreter():
    run_in_fresh_interpreter(__file__)


def make_inputs(b, hq, hkv, d, s_max, dtype, lengths, seed, strided=False):
    """Random q/k/v (never zeros) and a copy of the caches with NaN past every length."""
    g = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(b, hq, d, generator=g)  # peakier softmax than unit scores
    k = torch.randn(b, hkv, s_max, d, generator=g)
    v = torch.randn(b, hkv, s_max, d, generator=g)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k_nan, v_nan = k.clone(), v.clone()
    for i, n in enumerate(lengths):
        k_nan[i, :, n:] = float("nan")  # the kernel must never read past a length
        v_nan[i, :, n:] = float("nan")
    q, k, v, k_nan, v_nan = (t.to(DEVICE) for t in (q, k, v, k_nan, v_nan))
    if strided:  # q sliced out of a wider projection; caches stored [B, S, Hkv, D]
        q_wide = torch.randn(b, hq, 2 * d, generator=g).to(dtype).to(DEVICE)
        q_wide[..., :d] = q
        q = q_wide[..., :d]
        k_nan = k_nan.transpose(1, 2).contiguous().transpose(1, 2)
        v_nan = v_nan.transpose(1, 2).contiguous().transpose(1, 2)
    return q, k, v, k_nan, v_nan, torch.tensor(lengths, dtype=torch.int32, device=DEVICE)


def check(out, q, k, v, lengths, scale):
    ref = decode_attention(q.double(), k.double(), v.double(), lengths, scale)
    tol = TOL[q.dtype]
    assert not out.isnan().any(), "output not fully written (or NaN leaked in)"
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < tol["rel"], f"relative error {rel:.2e}"
    torch.testing.assert_close(out.double(), ref, atol=tol["atol"], rtol=tol["rtol"])


CASES = [
    # id, head dim, Hq, Hkv, dtype, lengths, S_max, num_splits (None: heuristic), block_n (None: default)
    ("d64-mha", 64, 4, 4, F16, [37], 48, None, None),
    ("d64-gqa8-ctx1", 64, 8, 1, BF16, [1], 16, None, None),
    ("d64-gqa7-batch2", 64, 14, 2, BF16, [130, 64], 130, None, None),
    ("d64-gqa16", 64, 16, 1, BF16, [50], 64, None, None),
    ("d64-more-splits-than-blocks", 64, 4, 2, BF16, [50, 3], 64, 16, None),
    ("d64-small-tiles-ragged", 64, 6, 2, F16, [250, 97], 256, 5, 16),
    ("d64-80-splits-chunked-combine", 64, 2, 1, F16, [1300], 1300, 80, 16),
    ("d128-gqa2-batch3", 128, 8, 4, BF16, [100, 1, 65], 128, None, None),
    ("d128-gqa3-not-divisible", 128, 12, 4, F16, [129, 7, 64], 160, None, None),
    ("d128-one-split", 128, 8, 1, F16, [300], 300, 1, None),
    ("d128-short-in-long-cache", 128, 4, 1, F16, [5, 300], 2048, None, None),
    ("d256-gqa6", 256, 6, 1, F16, [70], 80, None, None),
    ("d256-gqa4-batch3", 256, 8, 2, BF16, [200, 33, 96], 200, 3, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(case, kernels):
    _, d, hq, hkv, dtype, lens, s_max, splits, block_n = case
    q, k, v, k_nan, v_nan, lengths = make_inputs(
        len(lens), hq, hkv, d, s_max, dtype, lens, seed=zlib.crc32(case[0].encode())
    )
    out = torch.full_like(q, float("nan"))
    got = fd.flash_decode(q, k_nan, v_nan, lengths, d**-0.5, num_splits=splits, out=out, block_n=block_n)
    assert got is out
    check(out, q, k, v, lengths, d**-0.5)


def test_strided_inputs(kernels):
    lens = [90, 17]
    q, k, v, k_nan, v_nan, lengths = make_inputs(2, 8, 2, 128, 96, BF16, lens, seed=7, strided=True)
    assert k_nan.stride(2) != 128 and q.stride(1) == 256
    assert fd.unsupported_reasons(q, k_nan, v_nan, lengths) == []
    check(fd.flash_decode(q, k_nan, v_nan, lengths, 0.1, num_splits=2), q, k, v, lengths, 0.1)


def test_partials_and_empty_splits_match_reference(kernels):
    # batch 2, 4 splits of 16-wide tiles: sequence 0 (length 100, 7 tiles, the last one partial) gives
    # split s the tiles s and s + 4 (split 3 only tile 3); sequence 1 (length 20, 2 tiles) leaves
    # splits 2 and 3 empty
    lens = [100, 20]
    q, k, v, _, _, lengths = make_inputs(2, 4, 2, 64, 112, F16, lens, seed=3)
    ws = fd.FlashDecodeWorkspace.allocate(2, 4, 64, 4, DEVICE)
    for t in (ws.m, ws.lsum, ws.acc):
        t.fill_(float("nan"))
    out = fd.flash_decode(q, k, v, lengths, 0.125, workspace=ws, block_n=16)
    m, lsum, acc = decode_partials(q.cpu(), k.cpu(), v.cpu(), lengths.cpu(), 0.125, num_splits=4, block_n=16)
    assert (
        torch.isinf(ws.m[1, :, 2:]).all() and (ws.lsum[1, :, 2:] == 0).all() and (ws.acc[1, :, 2:] == 0).all()
    )
    torch.testing.assert_close(ws.m.cpu().double(), m, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(ws.lsum.cpu().double(), lsum, atol=1e-2, rtol=2e-3)
    torch.testing.assert_close(ws.acc.cpu().double(), acc, atol=1e-2, rtol=2e-3)
    torch.testing.assert_close(out.cpu().double(), combine_partials(m, lsum, acc), atol=2e-3, rtol=2e-3)


def test_workspace_reuse_with_new_lengths(kernels):
    # what a captured CUDA graph does: same buffers and grid, new lengths written into the same tensor
    q, k, v, _, _, lengths = make_inputs(2, 8, 2, 64, 200, F16, [200, 200], seed=5)
    ws = fd.FlashDecodeWorkspace.allocate(4, 8, 64, 6, DEVICE)  # more sequences than needed
    out = torch.empty_like(q)
    for lens in ([200, 3], [1, 129], [64, 65]):
        lengths.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        fd.flash_decode(q, k, v, lengths, 0.125, out=out, workspace=ws)
        check(out, q, k, v, lengths, 0.125)


def test_combine_reference_recovers_attention():
    g = torch.Generator().manual_seed(11)
    q, k, v = (
        torch.randn(3, 6, 32, generator=g),
        torch.randn(3, 3, 70, 32, generator=g),
        torch.randn(3, 3, 70, 32, generator=g),
    )
    lengths = torch.tensor([1, 33, 70])
    want = decode_attention(q.double(), k.double(), v.double(), lengths, 0.2)
    for splits, block_n in ((1, 16), (3, 8), (9, 16), (40, 4)):
        got = combine_partials(*decode_partials(q, k, v, lengths, 0.2, splits, block_n))
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_unsupported_reasons(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # on CPU, the good case counts as supported only then
    q, k, v, _, _, lengths = make_inputs(2, 8, 2, 64, 32, F16, [32, 32], seed=1)
    assert fd.unsupported_reasons(q, k, v, lengths) == []

    def reasons(**kw):
        args = dict(q=q, k_cache=k, v_cache=v, lengths=lengths) | kw
        return " ".join(fd.unsupported_reasons(**args))

    assert "head dim 48" in reasons(q=q[..., :48], k_cache=k[..., :48], v_cache=v[..., :48])
    assert "not a multiple" in reasons(q=q[:, :7])
    assert "GQA ratio 32" in reasons(q=q.repeat(1, 8, 1))
    assert "float32" in reasons(q=q.float(), k_cache=k.float(), v_cache=v.float())
    assert "dtypes differ" in reasons(v_cache=v.bfloat16())
    assert "contiguous" in reasons(k_cache=k.transpose(-1, -2).contiguous().transpose(-1, -2))
    assert "int32" in reasons(lengths=lengths.long())
    assert "int32 [2]" in reasons(lengths=lengths[:1])


def test_unsupported_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 4, 64, dtype=F16)
    kv = torch.randn(1, 4, 8, 64, dtype=F16)
    assert "interpreter is off" in " ".join(
        fd.unsupported_reasons(x, kv, kv, torch.ones(1, dtype=torch.int32))
    )


# --- the split heuristic, on its own -------------------------------------------------------------


def test_num_splits_examples():
    # 132 SMs, batch 1: 8 KV heads -> 16 splits (128 programs); 4 KV heads -> 33 wanted, but 256 or 512
    # tiles over 33 splits leave the 33rd empty, so 32; short contexts are capped
    ctxs = (1, 256, 512, 4096, 16384, 32768)
    assert [fd.num_splits(132, 1, 8, ctx, 64) for ctx in ctxs] == [1, 1, 2, 16, 16, 16]
    assert [fd.num_splits(132, 1, 4, ctx, 64) for ctx in ctxs] == [1, 1, 2, 16, 32, 32]
    assert fd.num_splits(132, 1, 4, 16384 + 64, 64) == 33  # 257 tiles: 8 per split needs all 33
    assert [fd.num_splits(132, 8, 8, ctx, 64) for ctx in ctxs] == [1, 1, 2, 2, 2, 2]


@pytest.mark.parametrize("num_sms", [8, 78, 132])
@pytest.mark.parametrize("block_n", [16, 64, 128])
def test_num_splits_properties(num_sms, block_n):
    for batch in (1, 3, 8, 64):
        for heads in (1, 4, 8):
            for ctx in [1, 2, 15, 16, 17, 100, 255, 256, 1000, 4096, 10_000, 16448, 32768, 131072]:
                s = fd.num_splits(num_sms, batch, heads, ctx, block_n)
                blocks = -(-ctx // block_n)
                per_split = -(-blocks // s)
                assert 1 <= s <= blocks, "never more splits than KV tiles"
                assert s == 1 or blocks // s >= fd.MIN_BLOCKS_PER_SPLIT, "each split covers enough tiles"
                assert (s - 1) * per_split < blocks, "no split is left empty"
                if ctx <= block_n * fd.MIN_BLOCKS_PER_SPLIT:
                    assert s == 1, "tiny contexts are not split"
                if batch * heads * 2 > fd.PROGRAMS_PER_SM * num_sms:
                    assert s == 1, "enough programs already"
                if s > 1:  # one wave, and no split count that fits in it gives a program fewer tiles
                    assert batch * heads * s <= fd.PROGRAMS_PER_SM * num_sms
                    widest = min(
                        blocks // fd.MIN_BLOCKS_PER_SPLIT, fd.PROGRAMS_PER_SM * num_sms // (batch * heads)
                    )
                    assert per_split == -(-blocks // widest)


def test_num_splits_falls_with_batch_and_heads():
    for ctx in (4096, 32768):
        by_batch = [fd.num_splits(132, b, 8, ctx, 64) for b in (1, 2, 4, 8, 16, 32, 64)]
        assert by_batch == sorted(by_batch, reverse=True) and by_batch[-1] == 1


def test_combine_program_shape_follows_the_splits():
    q128, k128 = torch.empty(1, 32, 128), torch.empty(1, 8, 16384, 128)
    q256, k256 = torch.empty(1, 24, 256), torch.empty(1, 4, 16384, 256)
    q64, k64 = torch.empty(1, 16, 64), torch.empty(1, 8, 16384, 64)

    def shape(q, k, splits, **tuning):
        cfg = fd._resolve(q, k, splits, None, **tuning)
        return cfg["combine_block_d"], cfg["combine_warps"]

    assert shape(q128, k128, 16) == (16, 1)  # 16 splits a step: a 16-wide slice, one warp
    assert shape(q256, k256, 32) == (16, 1)
    assert shape(q128, k128, 2) == (32, 1)  # few splits: a 32-wide slice
    assert shape(q256, k256, 8) == (32, 1)
    assert shape(q256, k256, 9) == (16, 1)  # 9 splits take a 16-lane step
    assert shape(q64, k64, 4) == (32, 1)
    assert shape(q256, k256, 64, combine_block_d=64) == (64, 8)  # 64 x 64 values a step: 8 warps
    assert shape(q256, k256, 32, combine_warps=2) == (16, 2)  # an override wins
    assert shape(q128, k128, 16, combine_block_d=32) == (32, 1)


def test_decode_config_reports_effective_settings():
    q, k, v, _, _, lengths = make_inputs(1, 32, 8, 128, 2048, BF16, [2048], seed=2)
    cfg = fd.decode_config(q, k, v, lengths)
    want = fd.num_splits(fd.sm_count(DEVICE), 1, 8, 2048, cfg["block_n"])
    assert cfg["num_splits"] == want and cfg["splits_from"] == "heuristic"
    assert {"block_n", "num_warps", "num_stages"} <= cfg.keys()
    assert fd.decode_config(q, k, v, lengths, num_splits=7)["splits_from"] == "override"
    ws = fd.FlashDecodeWorkspace.allocate(1, 32, 128, 5, DEVICE)
    assert fd.decode_config(q, k, v, lengths, workspace=ws)["num_splits"] == 5


# --- real sizes on the GPU -----------------------------------------------------------------------

GPU_SHAPES = [(32, 8, 128), (24, 4, 256)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("ctx", [4096, 16384, 32768])
@pytest.mark.parametrize("hq,hkv,d", GPU_SHAPES)
@pytest.mark.parametrize("variant", ["default", "pdl-both"])
def test_gpu_real_sizes(hq, hkv, d, ctx, batch, variant):
    tuning = LAUNCH_VARIANTS.get(variant, {})
    g = torch.Generator(device="cuda").manual_seed(ctx + batch)
    q = torch.randn(batch, hq, d, device="cuda", generator=g, dtype=BF16)
    k = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g, dtype=BF16)
    v = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g, dtype=BF16)
    lengths = torch.randint(ctx // 2, ctx + 1, (batch,), device="cuda", generator=g, dtype=torch.int32)
    lengths[0] = ctx
    out = torch.full_like(q, float("nan"))
    fd.flash_decode(q, k, v, lengths, d**-0.5, out=out, **tuning)
    ref = decode_attention(q.float(), k.float(), v.float(), lengths, d**-0.5).double()
    assert not out.isnan().any()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)


LAUNCH_VARIANTS = {
    "plain": {"pdl": False, "pdl_wait": False},
    "pdl": {"pdl": True, "pdl_wait": False},
    "pdl-both": {"pdl": True, "pdl_wait": True},
}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("variant", list(LAUNCH_VARIANTS))
@pytest.mark.parametrize("hq,hkv,d", GPU_SHAPES)
def test_gpu_cuda_graph_replay_follows_lengths(hq, hkv, d, variant):
    tuning = LAUNCH_VARIANTS[variant]
    batch, s_max = 4, 8192
    q, k, v, _, _, lengths = make_inputs(batch, hq, hkv, d, s_max, BF16, [s_max] * batch, seed=9)
    cfg = fd.decode_config(q, k, v, lengths)
    ws = fd.FlashDecodeWorkspace.allocate(batch, hq, d, cfg["num_splits"], DEVICE)
    out = torch.empty_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fd.flash_decode(
            q, k, v, lengths, d**-0.5, out=out, workspace=ws, **tuning
        )  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fd.flash_decode(q, k, v, lengths, d**-0.5, out=out, workspace=ws, **tuning)
    for lens in ([s_max, 1, 4000, 77], [5000, 8191, 64, 65]):
        lengths.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        check(out, q, k, v, lengths, d**-0.5)
