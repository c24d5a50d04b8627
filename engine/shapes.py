"""Real model shapes with random weights, for timing where a model file cannot be carried (the GPU box).

Weights are drawn on the target device in the target dtype; nothing is dequantized. Records made
with these say ``random_weights: true``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from typing import TypedDict

import torch

from engine.config import ModelConfig
from engine.model import Transformer


class _Family(TypedDict):
    """The ModelConfig fields a model family's shapes share."""

    arch: str
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float
    qk_norm: bool
    qkv_bias: bool


def _qwen(arch: str, context_length: int, *, qk_norm: bool, qkv_bias: bool) -> _Family:
    """A Qwen family: Qwen2 and Qwen3 share the tokenizer's vocabulary, the RoPE base and the norms' epsilon."""
    return _Family(
        arch=arch,
        vocab_size=151936,
        context_length=context_length,
        rope_base=1e6,
        rms_eps=1e-6,
        qk_norm=qk_norm,
        qkv_bias=qkv_bias,
    )


_QWEN3 = _qwen("qwen3", 40960, qk_norm=True, qkv_bias=False)
_QWEN2 = _qwen("qwen2", 32768, qk_norm=False, qkv_bias=True)
SHAPES: dict[str, ModelConfig] = {
    "qwen3-8b": ModelConfig(
        n_layer=36,
        d_model=4096,
        n_head=32,
        n_kv_head=8,
        head_dim=128,
        d_ff=12288,
        tied_output=False,
        **_QWEN3,
    ),
    "qwen3-1.7b": ModelConfig(
        n_layer=28, d_model=2048, n_head=16, n_kv_head=8, head_dim=128, d_ff=6144, tied_output=True, **_QWEN3
    ),
    # not a real model: two small layers, for smoke tests and the test suite where the weights are random;
    # the FFN is wide enough (as in real shapes) that each layer moves the logits: skipping the last changes
    # half of the greedy tokens; a qwen3 with a small vocabulary and context
    "qwen3-tiny": replace(
        ModelConfig(
            n_layer=2, d_model=256, n_head=4, n_kv_head=2, head_dim=64, d_ff=2048, tied_output=True, **_QWEN3
        ),
        vocab_size=2048,
        context_length=4096,
    ),
    "qwen2.5-0.5b": ModelConfig(
        n_layer=24, d_model=896, n_head=14, n_kv_head=2, head_dim=64, d_ff=4864, tied_output=True, **_QWEN2
    ),
}


def shape_config(name: str) -> ModelConfig:
    """The config of a named shape; ValueError listing the known ones otherwise."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(sorted(SHAPES))}") from None


def shape_digest(cfg: ModelConfig, seed: int) -> str:
    """A stand-in model_sha256 for random weights: the hash of the shape and the seed."""
    blob = json.dumps({"random_weights": True, "seed": seed, **asdict(cfg)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def random_transformer(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0, max_pos: int | None = None
) -> Transformer:
    """A Transformer of the given shape with N(0, 0.02) weights (norms at 1), built on the device."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, 0.02, generator=gen)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    d, hd = cfg.d_model, cfg.head_dim
    qkv = (cfg.n_head + 2 * cfg.n_kv_head) * hd
    weights = {"tok_embd": rnd(cfg.vocab_size, d), "out_norm": ones(d)}
    if not cfg.tied_output:
        weights["w_out"] = rnd(cfg.vocab_size, d)
    layers = []
    for _ in range(cfg.n_layer):
        w = {
            "attn_norm": ones(d),
            "wqkv": rnd(qkv, d),
            "wo": rnd(d, cfg.n_head * hd),
            "ffn_norm": ones(d),
            "w_gate_up": rnd(2 * cfg.d_ff, d),
            "w_down": rnd(d, cfg.d_ff),
        }
        if cfg.qkv_bias:
            w["bqkv"] = rnd(qkv)
        if cfg.qk_norm:
            w["q_norm"], w["k_norm"] = ones(hd), ones(hd)
        layers.append(w)
    return Transformer(replace(cfg), weights, layers, max_pos or cfg.context_length, device)
