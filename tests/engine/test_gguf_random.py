"""bench/gguf_random.py on the tiny shape: the file holds the planned tensors, our loader reads it, and
llama.cpp loads it and agrees with our engine on it (the 8B file it writes on the GPU box is the same
code at another shape)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

spec = importlib.util.spec_from_file_location(
    "gguf_random", Path(__file__).resolve().parents[2] / "bench" / "gguf_random.py"
)
gr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gr)

IDS = list(range(10, 40))


@pytest.fixture(scope="module", params=["bf16", "f16"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf_random") / f"tiny-{request.param}.gguf"
    info = gr.write(path, "qwen3-tiny", request.param, seed=3, device="cpu")
    return path, info, request.param


def test_tensors_and_metadata(tiny):
    from engine.shapes import shape_config

    path, info, dtype = tiny
    cfg = shape_config("qwen3-tiny")
    r = gguf.GGUFReader(str(path))
    names = [t.name for t in r.tensors]
    assert names == [n for n, _, _ in gr.tensor_plan(cfg)]
    assert info["n_tensors"] == len(names) == 2 + cfg.n_layer * 11  # tied output: no output.weight
    want = gguf.GGMLQuantizationType.BF16 if dtype == "bf16" else gguf.GGMLQuantizationType.F16
    for t in r.tensors:
        assert t.tensor_type == (want if len(t.shape) == 2 else gguf.GGMLQuantizationType.F32), t.name
    embd = r.tensors[0]
    assert [int(x) for x in embd.shape] == [cfg.d_model, cfg.vocab_size]
    raw = np.asarray(embd.data)
    vals = (
        (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        if dtype == "bf16"
        else raw.view(np.float16).astype(np.float32)
    )
    assert abs(float(vals.std()) - gr.STD) < 0.002 and abs(float(vals.mean())) < 0.002
    tokens = r.get_field("tokenizer.ggml.tokens")
    assert len(tokens.data) == cfg.vocab_size
    assert int(r.get_field("qwen3.block_count").contents()) == cfg.n_layer


def test_vocabulary_pads_to_the_real_size():
    tokens, types, merges = gr.vocabulary(151936)
    assert len(tokens) == len(types) == 151936 and len(set(tokens)) == 151936
    assert tokens[-1] == "[PAD151935]" and types[-1] == int(gguf.TokenType.UNUSED)
    assert "<|im_end|>" in tokens and merges


def test_engine_loads_it(tiny):
    from engine.generate import Session, load
    from engine.shapes import shape_config

    path, _, _ = tiny
    lm = load(path)
    cfg = shape_config("qwen3-tiny")
    for field in ("n_layer", "d_model", "n_head", "n_kv_head", "head_dim", "d_ff", "vocab_size", "qk_norm"):
        assert getattr(lm.cfg, field) == getattr(cfg, field), field
    logits = Session(lm, max_seq=64).forward(IDS)
    assert torch.isfinite(logits).all()


@pytest.mark.reference
def test_llama_cpp_loads_it_and_agrees(tiny):
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine.generate import Session, load

    path, _, _ = tiny
    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=2)
    llm.eval(IDS)
    ref = np.asarray(llm.scores[: llm.n_tokens])[-1].copy()
    llm.close()
    ours = Session(load(path), max_seq=64).forward(IDS).float().numpy()
    assert int(ref.argmax()) == int(ours.argmax())
    assert float(np.abs(ref - ours).max()) < 0.05 * float(np.abs(ref).max())
