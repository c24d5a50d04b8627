"""Tiny synthetic qwen2/qwen3 GGUF files, written with gguf.GGUFWriter, for tests.

No real Qwen3 weights are reachable, so the qwen3 path is checked by writing a small random model
that llama.cpp also loads. The vocabulary is a real byte-level BPE trained (with ``tokenizers``) on
the bundled corpus, so the file carries a complete gpt2-style tokenizer that both sides accept.

    python -m engine.synthetic PATH [--arch qwen3] [--seed 0]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from engine.prompts import corpus_text

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN2_PRE_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of a synthetic model."""

    arch: str = "qwen3"
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    n_kv_head: int = 2
    head_dim: int = 32
    d_ff: int = 128
    vocab_size: int = 384
    context_length: int = 2048
    tied_output: bool = False
    seed: int = 0


def train_vocab(vocab_size: int) -> tuple[list[str], list[str]]:
    """A byte-level BPE (tokens, merges) trained on the bundled corpus, specials last."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([corpus_text()], trainer)
    model = tok.to_str()
    import json

    spec = json.loads(model)["model"]
    vocab: dict[str, int] = spec["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    return tokens + list(SPECIALS), merges


def write(path: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Write a random model with a trained vocabulary; weights mix F32, F16, BF16 and Q8_0."""
    path = Path(path)
    if spec.arch == "qwen2" and spec.head_dim * spec.n_head != spec.d_model:
        raise ValueError("llama.cpp's qwen2 derives head_dim from d_model / n_head; make them agree")
    rng = np.random.default_rng(spec.seed)
    tokens, merges = train_vocab(spec.vocab_size)
    vocab = len(tokens)
    arch = spec.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"synthetic-{arch}")
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.d_model)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.d_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv_head)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def add(
        name: str, arr: np.ndarray, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
    ) -> None:
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    d, hd, hq, hkv = spec.d_model, spec.head_dim, spec.n_head, spec.n_kv_head
    q8, f16, bf16 = (
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.BF16,
    )
    add("token_embd.weight", normal(vocab, d, std=1.0), q8)
    add("output_norm.weight", 1.0 + normal(d, std=0.1))
    if not spec.tied_output:
        # a large output scale spreads the logits, so top-1 is decided by clear margins, not near-ties
        add("output.weight", normal(vocab, d, std=1.0), f16)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 1.0 + normal(d, std=0.1))
        add(p + "attn_q.weight", normal(hq * hd, d, std=d**-0.5), bf16)
        add(p + "attn_k.weight", normal(hkv * hd, d, std=d**-0.5), f16)
        add(p + "attn_v.weight", normal(hkv * hd, d, std=d**-0.5))
        add(p + "attn_output.weight", normal(d, hq * hd, std=(hq * hd) ** -0.5), q8)
        if arch == "qwen3":
            add(p + "attn_q_norm.weight", 1.0 + normal(hd, std=0.1))
            add(p + "attn_k_norm.weight", 1.0 + normal(hd, std=0.1))
        else:
            add(p + "attn_q.bias", normal(hq * hd, std=0.1))
            add(p + "attn_k.bias", normal(hkv * hd, std=0.1))
            add(p + "attn_v.bias", normal(hkv * hd, std=0.1))
        add(p + "ffn_norm.weight", 1.0 + normal(d, std=0.1))
        add(p + "ffn_gate.weight", normal(spec.d_ff, d, std=d**-0.5), f16)
        add(p + "ffn_up.weight", normal(spec.d_ff, d, std=d**-0.5))
        add(p + "ffn_down.weight", normal(d, spec.d_ff, std=spec.d_ff**-0.5), bf16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.synthetic", description="write a tiny random GGUF model"
    )
    parser.add_argument("path")
    parser.add_argument("--arch", choices=("qwen2", "qwen3"), default="qwen3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tied", action="store_true")
    args = parser.parse_args(argv)
    head_dim = 32 if args.arch == "qwen3" else 16
    print(
        write(
            args.path, SyntheticSpec(arch=args.arch, head_dim=head_dim, seed=args.seed, tied_output=args.tied)
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
