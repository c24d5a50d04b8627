"""Write a random-weight GGUF of one of the engine's shapes (engine/shapes.py), for llama.cpp to time.

The file has the layout llama.cpp's qwen3 (or qwen2) loader expects: its metadata keys, its tensor
names, and a loadable gpt2-style vocabulary, a small byte-level BPE trained on the bundled corpus
(engine.synthetic) padded with ``[PAD{i}]`` tokens of type UNUSED up to the shape's vocabulary size,
as convert_hf_to_gguf pads Qwen's. Matrices are N(0, 0.02) in BF16 (default) or F16; norms are 1 in
F32. The bits are drawn with torch on the GPU when there is one and written one tensor at a time
(the next tensor is drawn while the current one is written), so a 16 GB file never sits in memory.

    python3 bench/gguf_random.py /tmp/qwen3-8b-bf16.gguf --shape qwen3-8b [--dtype bf16|f16]

Prints one JSON line: the path, bytes, tensor count and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gguf

from engine.config import ModelConfig
from engine.shapes import SHAPES, shape_config
from engine.synthetic import SPECIALS, train_vocab

STD = 0.02
TRAINED_VOCAB = 512  # the BPE part of the vocabulary; the rest is padding


def vocabulary(n: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): a trained BPE with the chat specials, padded to n entries."""
    tokens, merges = train_vocab(min(n, TRAINED_VOCAB))
    if len(tokens) > n:
        raise ValueError(f"a vocabulary of {n} entries cannot hold the {len(tokens)} trained tokens")
    types = [int(gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL) for t in tokens]
    pad = n - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n)]
    types += [int(gguf.TokenType.UNUSED)] * pad
    return tokens, types, merges


def tensor_plan(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], bool]]:
    """(llama.cpp tensor name, numpy shape, is a matrix) in file order."""
    d, hd, hq, hkv = cfg.d_model, cfg.head_dim, cfg.n_head, cfg.n_kv_head
    plan: list[tuple[str, tuple[int, ...], bool]] = [
        ("token_embd.weight", (cfg.vocab_size, d), True),
        ("output_norm.weight", (d,), False),
    ]
    if not cfg.tied_output:
        plan.append(("output.weight", (cfg.vocab_size, d), True))
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (d,), False),
            (p + "attn_q.weight", (hq * hd, d), True),
            (p + "attn_k.weight", (hkv * hd, d), True),
            (p + "attn_v.weight", (hkv * hd, d), True),
        ]
        if cfg.qkv_bias:
            plan += [
                (p + "attn_q.bias", (hq * hd,), False),
                (p + "attn_k.bias", (hkv * hd,), False),
                (p + "attn_v.bias", (hkv * hd,), False),
            ]
        plan.append((p + "attn_output.weight", (d, hq * hd), True))
        if cfg.qk_norm:
            plan += [(p + "attn_q_norm.weight", (hd,), False), (p + "attn_k_norm.weight", (hd,), False)]
        plan += [
            (p + "ffn_norm.weight", (d,), False),
            (p + "ffn_gate.weight", (cfg.d_ff, d), True),
            (p + "ffn_up.weight", (cfg.d_ff, d), True),
            (p + "ffn_down.weight", (d, cfg.d_ff), True),
        ]
    return plan


def _drawer(
    dtype: str, device: torch.device, seed: int
) -> Callable[[str, tuple[int, ...], bool], np.ndarray]:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16

    def draw(name: str, shape: tuple[int, ...], matrix: bool) -> np.ndarray:
        if not matrix:
            if name.endswith(".bias"):
                return torch.empty(shape, device=device).normal_(0.0, STD, generator=gen).cpu().numpy()
            return np.ones(shape, dtype=np.float32)
        t = torch.empty(shape, device=device, dtype=tdtype).normal_(0.0, STD, generator=gen)
        if dtype == "bf16":  # numpy has no bfloat16: the raw 16-bit patterns go out as uint16
            return t.view(torch.int16).cpu().numpy().view(np.uint16)
        return t.cpu().numpy()

    return draw


def write(
    path: str | Path, shape: str, dtype: str = "bf16", seed: int = 0, device: str = "auto"
) -> dict[str, object]:
    """Write the file; returns what main prints."""
    if dtype not in ("bf16", "f16"):
        raise ValueError(f"dtype {dtype!r}: bf16 or f16")
    t0 = time.perf_counter()
    path = Path(path)
    cfg = shape_config(shape)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    tokens, types, merges = vocabulary(cfg.vocab_size)
    arch = cfg.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"random-{shape}-{dtype}")
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_kv_head)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bf16" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)

    qtype = gguf.GGMLQuantizationType.BF16 if dtype == "bf16" else gguf.GGMLQuantizationType.F16
    npdtype = np.dtype(np.uint16 if dtype == "bf16" else np.float16)
    plan = tensor_plan(cfg)
    for name, shp, matrix in plan:
        n = int(np.prod(shp))
        if matrix:
            w.add_tensor_info(name, shp, npdtype, n * 2, raw_dtype=qtype)
        else:
            w.add_tensor_info(name, shp, np.dtype(np.float32), n * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    draw = _drawer(dtype, dev, seed)

    def arrays() -> Iterator[np.ndarray]:
        # one tensor ahead: the next is drawn (and copied off the GPU) while this one is written
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead = pool.submit(draw, *plan[0])
            for k in range(len(plan)):
                arr = ahead.result()
                if k + 1 < len(plan):
                    ahead = pool.submit(draw, *plan[k + 1])
                yield arr

    total = 0
    for arr in arrays():
        w.write_tensor_data(arr)
        total += arr.nbytes
    w.close()
    return {
        "path": str(path),
        "shape": shape,
        "dtype": dtype,
        "arch": arch,
        "bytes": path.stat().st_size,
        "tensor_bytes": total,
        "n_tensors": len(plan),
        "vocab": len(tokens),
        "device": dev.type,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", default="auto", help="where the bits are drawn: auto (cuda if any), cuda, cpu"
    )
    args = parser.parse_args(argv)
    print(json.dumps(write(args.path, args.shape, args.dtype, args.seed, args.device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
