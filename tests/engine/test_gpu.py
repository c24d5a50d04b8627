"""The CUDA decode path (bf16, static cache, Triton decode attention, CUDA graph). Runs on the GPU box."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.generate import Session, load, load_random
from engine.prompts import tokens_of_length
from engine.synthetic import SyntheticSpec, write

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.fixture(scope="module")
def synth64(tmp_path_factory):
    # head dim 64, so decode attention takes the Triton kernel rather than the reference
    return write(
        tmp_path_factory.mktemp("gpu") / "q3.gguf",
        SyntheticSpec(arch="qwen3", d_model=128, n_head=4, n_kv_head=2, head_dim=64, seed=3),
    )


def test_cuda_decode_uses_the_table_kernel_and_matches_cpu_fp32(synth64):
    cpu, gpu = load(synth64, "cpu"), load(synth64, "cuda")
    assert gpu.dtype == torch.bfloat16
    ids = tokens_of_length(cpu.tokenizer, 96)
    ref = Session(cpu, 128).generate(ids[:64], 32).token_ids
    s = Session(gpu, 128)
    cfg = ops.decode_config(gpu.cfg.n_head, s.cache)
    # the first kernel of the table that passed its parity test at this cache's shape; nothing timed
    assert cfg["backend"] in ops.DECODE_KERNELS and cfg["chosen_by"] == "table"
    assert all(c["us"] is None for c in cfg["candidates"].values())
    assert cfg["candidates"][cfg["backend"]]["error"] is None
    ours = s.generate(ids[:64], 32).token_ids
    # bf16 weights and activations: greedy may drift at a near-tie, but the start must agree
    assert ours[:8] == ref[:8]
    full_cpu = Session(cpu, 128).forward(ids, all_logits=True)
    g = Session(gpu, 128)
    g.forward(ids[:64])
    steps = torch.stack([g.forward([t]).cpu() for t in ids[64:]])
    agree = (steps.argmax(-1) == full_cpu[64:].argmax(-1)).float().mean()
    assert agree >= 0.9, f"top-1 agreement of GPU decode vs CPU fp32: {agree:.3f}"


def test_graph_replay_equals_eager_decode():
    lm = load_random("qwen3-1.7b", "cuda", max_pos=1024)
    prompt = torch.randint(0, lm.cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    outs = []
    for graph in (False, True):
        s = Session(lm, 512, cuda_graph=graph)
        logits = s.forward(prompt)
        outs.append(s.greedy_on_device(logits.argmax(), 40).tolist())
    assert outs[0] == outs[1]


def test_compiled_graph_decode_writes_the_cache_like_prefill():
    # the compiled, graphed step stores each step's key and value inside its fused RoPE/norm kernel;
    # prefilling the same tokens must leave the same cache and predict the same tokens
    lm = load_random("qwen3-1.7b", "cuda", max_pos=1024)
    lm.transformer.compile()
    # this test is about the cache writes, so it pins the decode kernel it was calibrated with: with the
    # measured choice at this shape the teacher-forced agreement read 0.88 on an H200 (2026-12-03; cache
    # errors 0.006), random weights' near-ties flipping under another kernel's rounding
    for block in lm.transformer.blocks:
        block.decode_kernel = "triton-flash-decode"
    prompt = torch.randint(0, lm.cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(4)).tolist()
    s = Session(lm, 512, cuda_graph=True)
    first = int(s.forward(prompt).argmax())
    tokens = [first, *s.greedy_on_device(torch.tensor(first, device="cuda"), 24).tolist()]
    ref = Session(lm, 512, cuda_graph=False)
    logits = ref.forward(prompt + tokens[:-1], all_logits=True)
    n = s.length
    assert n == ref.length == 300 + 24
    errs = {
        name: (
            (a[:, :, :, :n].float() - b[:, :, :, :n].float()).norm() / b[:, :, :, :n].float().norm()
        ).item()
        for name, a, b in (("k", s.cache.k, ref.cache.k), ("v", s.cache.v, ref.cache.v))
    }
    decoded = (s.cache.k[:, :, :, 300:n].float().abs().amax(-1) > 0).float().mean().item()
    agree = (logits[299:].argmax(-1).cpu() == torch.tensor(tokens)).float().mean().item()
    assert decoded == 1.0 and max(errs.values()) < 2e-2 and agree >= 0.9, (errs, decoded, agree)


def test_decode_path_matches_prefill_logits_on_cuda():
    lm = load_random("qwen2.5-0.5b", "cuda", max_pos=512)
    ids = torch.randint(0, lm.cfg.vocab_size, (80,), generator=torch.Generator().manual_seed(1)).tolist()
    full = Session(lm, 128).forward(ids, all_logits=True)
    s = Session(lm, 128)
    s.forward(ids[:40])
    steps = torch.stack([s.forward([t]) for t in ids[40:]])
    # bf16: kernels differ (SDPA prefill vs Triton decode), so compare distributions, not bits
    p, q = torch.log_softmax(full[40:].double(), -1), torch.log_softmax(steps.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    assert kl.mean() < 0.02, kl.mean()


@pytest.mark.parametrize(
    "hq,hkv,t,s",
    [(14, 2, 80, 80), (14, 2, 40, 40), (14, 2, 8, 80), (16, 8, 64, 64), (32, 8, 512, 512), (24, 4, 7, 300)],
)
def test_cuda_prefill_attention_matches_reference(hq, hkv, t, s):
    from kernels.reference import attention

    g = torch.Generator(device="cuda").manual_seed(hq * 1000 + t)
    q = torch.randn(1, hq, t, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, hkv, s, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, hkv, s, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    ours = ops.attention(q, k, v, s, 0.125).double()
    ref = attention(q.double(), k.double(), v.double(), 0.125)
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
