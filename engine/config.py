"""Model configuration, read from GGUF metadata. Pure: it takes the metadata mapping, does no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """GGUF metadata that does not describe a usable model."""


@dataclass(frozen=True)
class ModelConfig:
    """The hyperparameters of a qwen2/qwen3 decoder."""

    arch: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float
    qk_norm: bool  # qwen3: per-head RMSNorm on q and k
    qkv_bias: bool  # qwen2: biases on the q/k/v projections
    tied_output: bool  # no separate output.weight: the embedding is reused

    @classmethod
    def from_metadata(
        cls, meta: Mapping[str, Any], tensor_names: set[str] | frozenset[str] = frozenset()
    ) -> ModelConfig:
        """Build a config from GGUF metadata and the tensor names (for bias/norm/tied detection)."""
        arch = meta.get("general.architecture")
        if arch not in ("qwen2", "qwen3"):
            raise ConfigError(f"architecture {arch!r} is not supported (qwen2, qwen3)")

        def need(key: str) -> Any:
            full = f"{arch}.{key}"
            if full not in meta:
                raise ConfigError(f"metadata key {full!r} is missing")
            return meta[full]

        d_model = int(need("embedding_length"))
        n_head = int(need("attention.head_count"))
        n_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
        head_dim = int(meta.get(f"{arch}.attention.key_length", d_model // n_head))
        if n_head <= 0 or n_kv <= 0 or n_head % n_kv:
            raise ConfigError(f"head_count {n_head} is not a multiple of head_count_kv {n_kv}")
        vocab = meta.get(f"{arch}.vocab_size")
        if vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise ConfigError(
                    "neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size"
                )
            vocab = len(tokens)
        names = set(tensor_names)
        return cls(
            arch=arch,
            n_layer=int(need("block_count")),
            d_model=d_model,
            n_head=n_head,
            n_kv_head=n_kv,
            head_dim=head_dim,
            d_ff=int(need("feed_forward_length")),
            vocab_size=int(vocab),
            context_length=int(need("context_length")),
            rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=float(need("attention.layer_norm_rms_epsilon")),
            qk_norm="blk.0.attn_q_norm.weight" in names,
            qkv_bias="blk.0.attn_q.bias" in names,
            tied_output=bool(names) and "output.weight" not in names,
        )
