"""Qwen2 and Qwen3 decoders as short nn.Modules.

qwen2: biases on the q/k/v projections. qwen3: per-head RMSNorm on q and k, no biases. Both use GQA,
NEOX-style RoPE, SwiGLU and a tied or untied output. q/k/v (and gate/up) are fused into one matmul
each at load time. Attention goes through ``engine.ops``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.config import ModelConfig
from engine.gguf import GGUFFile
from engine.kv_cache import KVCache


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, as llama.cpp does, returned in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope_tables(
    head_dim: int, max_pos: int, base: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_pos, head_dim/2] for NEOX RoPE, computed in float64 then rounded."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [D/2]
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX rotation: pairs are (i, i + D/2), not adjacent elements."""
    # x: [B, H, T, D]; cos/sin: [T, D/2] (shared positions) or [B, 1, 1, D/2] (one position per sequence)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


TUNINGS = ("pinned", "measured")
# Inductor's settings under which nothing in a compile is chosen by timing on the device: one Triton
# config per kernel (no pointwise or reduction autotuning, no coordinate descent, no padding benchmark),
# so that every process of the same code on the same GPU runs the same kernels. With Inductor's defaults
# each fresh compile timed its candidate configs itself and kept its own draw, and with it its own decode
# speed for its whole life (docs/benchmarks.md, #40).
PINNED_INDUCTOR: dict[str, Any] = {
    "deterministic": True,
    "triton.autotune_pointwise": False,
    "coordinate_descent_tuning": False,
    "max_autotune": False,
    "max_autotune_pointwise": False,
}


def compile_options(tuning: str, known: Sequence[str] | None = None) -> dict[str, Any]:
    """torch.compile's Inductor options for a tuning (TUNINGS): "pinned" sets PINNED_INDUCTOR, less any
    setting this torch does not know (`known`: its config's names, read from Inductor when None);
    "measured" keeps Inductor's defaults. ValueError for another tuning."""
    if tuning not in TUNINGS:
        raise ValueError(f"unknown tuning {tuning!r}; known: {', '.join(TUNINGS)}")
    if tuning == "measured":
        return {}
    if known is None:
        import torch._inductor.config as inductor_config

        known = list(inductor_config.get_config_copy())
    return {k: v for k, v in PINNED_INDUCTOR.items() if k in set(known)}


class LayerWeights(NamedTuple):
    """One layer's tensors, by the names the math uses. None where the model has none (qwen2: no q/k
    norms; qwen3: no q/k/v bias). torch.compile flattens a NamedTuple into its tensors, so the compiled
    layer is the same as with the tensors passed one by one."""

    attn_norm: torch.Tensor
    wqkv: torch.Tensor  # [(Hq + 2 Hkv) * D, d_model]
    bqkv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    wo: torch.Tensor  # [d_model, Hq * D]
    ffn_norm: torch.Tensor
    w_gate_up: torch.Tensor  # [2 d_ff, d_model]
    w_down: torch.Tensor  # [d_model, d_ff]

    @classmethod
    def of(cls, w: dict[str, torch.Tensor]) -> LayerWeights:
        return cls(
            w["attn_norm"],
            w["wqkv"],
            w.get("bqkv"),
            w.get("q_norm"),
            w.get("k_norm"),
            w["wo"],
            w["ffn_norm"],
            w["w_gate_up"],
            w["w_down"],
        )


class Heads(NamedTuple):
    """Attention's shape and the norms' epsilon: plain numbers, constants to torch.compile."""

    n_q: int
    n_kv: int
    dim: int
    eps: float


def qkv_projection(
    x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, heads: Heads
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pre-norm, fused q/k/v projection, qwen3's q/k norms and RoPE: ([B,Hq,T,D], [B,Hkv,T,D], [B,Hkv,T,D])."""
    b, t, _ = x.shape
    hq, hkv, hd, eps = heads
    h = rms_norm(x, w.attn_norm, eps)
    qkv = F.linear(h, w.wqkv, w.bqkv)  # [B, T, (Hq + 2 Hkv) * D]
    q, k, v = qkv.split((hq * hd, hkv * hd, hkv * hd), dim=-1)
    q = q.view(b, t, hq, hd).transpose(1, 2)  # [B, Hq, T, D]
    k = k.view(b, t, hkv, hd).transpose(1, 2)  # [B, Hkv, T, D]
    v = v.view(b, t, hkv, hd).transpose(1, 2)
    if w.q_norm is not None and w.k_norm is not None:
        q = rms_norm(q, w.q_norm, eps)
        k = rms_norm(k, w.k_norm, eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def qkv_projection_into_cache(
    x: torch.Tensor,
    w: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: Heads,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    pos: torch.Tensor,
) -> torch.Tensor:
    """Decode: `qkv_projection` of one token per sequence, whose key and value are stored in the layer's
    caches ([B, Hkv, S_max, D]) at [rows[b], :, pos[b]]; returns q [B, Hq, 1, D].

    One function, so that torch.compile fuses the two cache writes into the RoPE/norm kernel instead of
    launching two indexing kernels per layer (measured on the H200: 72 launches, ~250 us per qwen3-8b token).
    """
    q, k, v = qkv_projection(x, w, cos, sin, heads)
    k_cache[rows, :, pos] = k[:, :, 0].to(k_cache.dtype)  # [B, Hkv, D] scattered to [b, :, pos[b]]
    v_cache[rows, :, pos] = v[:, :, 0].to(v_cache.dtype)
    return q


def qkv_block_into_cache(
    x: torch.Tensor,
    w: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: Heads,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
) -> torch.Tensor:
    """A block step: `qkv_projection` of T rows at device positions pos [T], whose keys and values are
    stored in the layer's caches at those positions; returns q [B, Hq, T, D]."""
    q, k, v = qkv_projection(x, w, cos, sin, heads)
    k_cache[:, :, pos] = k.to(k_cache.dtype)
    v_cache[:, :, pos] = v.to(v_cache.dtype)
    return q


def attention_output_and_ffn(x: torch.Tensor, a: torch.Tensor, w: LayerWeights, eps: float) -> torch.Tensor:
    """Output projection and residual, then the SwiGLU block and its residual."""
    b, hq, t, hd = a.shape
    x = x + F.linear(a.transpose(1, 2).reshape(b, t, hq * hd), w.wo)
    h = rms_norm(x, w.ffn_norm, eps)
    gate, up = F.linear(h, w.w_gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w.w_down)


class DecodeStep(NamedTuple):
    """Device-side indices of one decode step: positions [B], batch rows [B], cache lengths [B] int32."""

    pos: torch.Tensor
    rows: torch.Tensor
    lengths: torch.Tensor


class Block(nn.Module):
    """One transformer layer: attention then SwiGLU, each behind a pre-RMSNorm."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        self.w = LayerWeights.of(w)
        self.heads = Heads(cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rms_eps)
        self.decode_splits: int | None = (
            None  # None: the kernel's heuristic; an int pins it (A/B experiments)
        )
        # None: ops' table; a name pins a kernel, ops.BY_TIMING times the candidates (A/B experiments)
        self.decode_kernel: str | None = None
        # the two dense halves of a layer; Transformer.compile() swaps in compiled versions (same math)
        self.pre = qkv_projection
        self.pre_decode = qkv_projection_into_cache
        self.pre_block = qkv_block_into_cache
        self.post = attention_output_and_ffn

    def forward(
        self,
        x: torch.Tensor,
        layer: int,
        cache: KVCache,
        pos: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        n_ctx: int | None,
        step: DecodeStep | None = None,
    ) -> torch.Tensor:
        """n_ctx given: T new tokens at shared positions pos (prefill). None: one token per sequence (step)."""
        scale = self.heads.dim**-0.5
        if n_ctx is not None:
            q, k, v = self.pre(x, self.w, cos, sin, self.heads)
            k_cache, v_cache = cache.write(layer, pos, k, v)
            a = ops.attention(q, k_cache, v_cache, n_ctx, scale)  # [B, Hq, T, D]
        else:
            # decode: nothing here depends on a host-side length, so the step can be captured in a CUDA graph
            assert step is not None
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            q = self.pre_decode(x, self.w, cos, sin, self.heads, k_cache, v_cache, step.rows, step.pos)
            a = ops.decode_attention(
                q[:, :, 0], k_cache, v_cache, step.lengths, scale, self.decode_splits, self.decode_kernel
            )[:, :, None]
        return self.post(x, a, self.w, self.heads.eps)

    def block_forward(
        self,
        x: torch.Tensor,
        layer: int,
        cache: KVCache,
        step: BlockStep,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """A fixed-width block of rows at device positions (decode and verify alike: `Transformer.block`)."""
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        q = self.pre_block(x, self.w, cos, sin, self.heads, k_cache, v_cache, step.pos)
        a = ops.block_attention(
            q, k_cache, v_cache, step.lengths, self.heads.dim**-0.5, step.n_real, step.split
        )
        return self.post(x, a, self.w, self.heads.eps)


class BlockStep(NamedTuple):
    """A block step's positions [T] and lengths [1, T] (device), real rows and split (host constants)."""

    pos: torch.Tensor
    lengths: torch.Tensor
    n_real: int
    split: int


class Transformer(nn.Module):
    """A qwen2/qwen3 decoder over a preallocated KV cache."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        layers: list[dict[str, torch.Tensor]],
        max_pos: int,
        device: torch.device,
    ):
        super().__init__()
        self.cfg = cfg
        self.tok_embd = weights["tok_embd"]  # [V, d_model]
        self.out_norm = weights["out_norm"]
        self.w_out = weights.get("w_out", self.tok_embd)  # [V, d_model]; tied when absent
        # an nn.ModuleList (so the layers are submodules) of Blocks: not generic, so typed by what it holds
        self.blocks = cast("Sequence[Block]", nn.ModuleList(Block(cfg, w) for w in layers))
        self.cos, self.sin = rope_tables(cfg.head_dim, max_pos, cfg.rope_base, device)
        self.compiled_with: dict[str, Any] | None = None  # compile()'s tuning and Inductor settings

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embd.dtype

    def weights(self) -> list[torch.Tensor]:
        """Every weight tensor once (a tied output is the embedding)."""
        out = [self.tok_embd, self.out_norm, self.w_out]
        out += [t for block in self.blocks for t in block.w if t is not None]
        return list({id(t): t for t in out}.values())

    def rebind(self, new: dict[int, torch.Tensor]) -> None:
        """Swap weights for others of the same values (keyed by the old tensor's id): a new placement."""
        self.tok_embd, self.out_norm = new[id(self.tok_embd)], new[id(self.out_norm)]
        self.w_out = new[id(self.w_out)]
        for block in self.blocks:
            block.w = LayerWeights._make(None if t is None else new[id(t)] for t in block.w)

    def pack(self, align: int = 2 << 20) -> int:
        """Move every weight into one allocation, each tensor of at least `align` bytes at an `align`-byte
        offset (the small ones at 256 bytes), in a fixed order; returns the allocation's bytes.

        An experiment on where the weights sit (bench/gpu_placement.py): on the H200 a qwen3-8b's decode
        rate moved by 0.34% sd between placements in one process, and by 0.36% packed, so packing is off
        by default (`engine serve --pack`). Call before CUDA graphs are captured."""
        tensors = self.weights()
        offsets, total = [], 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            step = align if nbytes >= align else 256
            total = -(-total // step) * step
            offsets.append(total)
            total += nbytes
        buf = torch.empty(total, dtype=torch.uint8, device=self.tok_embd.device)
        new = {}
        for t, off in zip(tensors, offsets, strict=True):
            view = buf[off : off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            new[id(t)] = view
        self.rebind(new)
        return total

    def compile(self, tuning: str = "pinned") -> None:
        """Fuse each layer's elementwise work with torch.compile (CUDA decode: far fewer kernel launches).

        The two halves of a layer are compiled once and shared by all layers (weights are arguments, so
        every layer hits the same compiled code, the layer's cache views too: their offsets differ, not
        their shapes); attention stays outside, and so do prefill's cache writes. `tuning` (TUNINGS):
        "pinned" chooses nothing by timing on the device, "measured" lets Inductor autotune and times the
        decode-attention kernels at load (see `compile_options`).
        """
        options = compile_options(tuning)
        self.compiled_with = {"tuning": tuning, "inductor": options}
        pre = torch.compile(qkv_projection, dynamic=False, options=options)
        pre_decode = torch.compile(qkv_projection_into_cache, dynamic=False, options=options)
        pre_block = torch.compile(qkv_block_into_cache, dynamic=False, options=options)
        post = torch.compile(attention_output_and_ffn, dynamic=False, options=options)
        for block in self.blocks:
            block.pre, block.pre_decode, block.pre_block, block.post = pre, pre_decode, pre_block, post
            if tuning == "measured" and block.decode_kernel is None:
                block.decode_kernel = ops.BY_TIMING

    def forward(self, ids: torch.Tensor, start: int, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """Run T new tokens at positions start..start+T-1; returns float32 logits [B, T or 1, V]."""
        # ids: [B, T]
        t = ids.shape[1]
        n_ctx = start + t
        if n_ctx > cache.max_seq:
            raise ValueError(f"context {n_ctx} exceeds the KV cache ({cache.max_seq} positions)")
        pos = torch.arange(start, n_ctx, device=ids.device)
        cos, sin = self.cos[start:n_ctx], self.sin[start:n_ctx]
        x = F.embedding(ids, self.tok_embd)  # [B, T, d_model]
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache, pos, cos, sin, n_ctx)
        if last_only:
            x = x[:, -1:]
        return self.logits(x)

    def decode(self, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per sequence (ids [B, 1]) at device positions pos [B]; float32 logits [B, V]."""
        b = ids.shape[0]
        half = self.cfg.head_dim // 2
        cos = self.cos.index_select(0, pos).view(b, 1, 1, half)
        sin = self.sin.index_select(0, pos).view(b, 1, 1, half)
        x = F.embedding(ids, self.tok_embd)  # [B, 1, d_model]
        # per-step index tensors, made once rather than once per layer (each is a kernel launch)
        step = DecodeStep(pos, torch.arange(b, device=pos.device), (pos + 1).to(torch.int32))
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache, pos, cos, sin, None, step)
        return self.logits(x)[:, 0]

    def block(
        self, ids: torch.Tensor, start: torch.Tensor, cache: KVCache, n_real: int, split: int
    ) -> torch.Tensor:
        """A fixed-width block of T rows (ids [1, T]) at positions start..start+T-1 (start: a device [1]
        tensor); the first n_real rows are real. Float32 logits [T, V].

        Row-invariant: a row's logits depend on its token, its position and the cache, not on the rows
        beside it or how many of them are real. Every call has the same shapes (the matmuls run with T
        rows whatever n_real is, attention through `ops.block_attention`), so one-token decode (n_real 1)
        and a verify pass of T rows give the same bits for the same position: lossless speculation in
        bf16. The cache must hold start + T positions (padding rows write theirs; later rows overwrite)."""
        t = ids.shape[1]
        if ids.shape[0] != 1:
            raise ValueError(f"a block step takes one sequence, got {ids.shape[0]}")
        pos = start + torch.arange(t, device=ids.device)  # [T]
        # padding rows may sit past the RoPE table; real rows never do (the session checks)
        rope_pos = pos.clamp(max=self.cos.shape[0] - 1)
        cos, sin = self.cos.index_select(0, rope_pos), self.sin.index_select(0, rope_pos)  # [T, D/2]
        step = BlockStep(pos, (pos + 1).to(torch.int32)[None], n_real, split)
        x = F.embedding(ids, self.tok_embd)  # [1, T, d_model]
        for i, block in enumerate(self.blocks):
            x = block.block_forward(x, i, cache, step, cos, sin)
        return self.logits(x)[0]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        x = rms_norm(x, self.out_norm, self.cfg.rms_eps)
        return F.linear(x, self.w_out).float()


def load_transformer(
    gf: GGUFFile, cfg: ModelConfig, max_pos: int, device: torch.device, dtype: torch.dtype
) -> Transformer:
    """Dequantize a GGUF's weights once into a Transformer of the given dtype on the given device."""

    def get(name: str) -> torch.Tensor:
        return gf.tensor(name).to(device=device, dtype=dtype)

    def cat(*names: str) -> torch.Tensor:
        # dequantized straight into the fused tensor's rows (no torch.cat copy of ~1 GB on the 0.5B)
        return gf.stacked(names).to(device=device, dtype=dtype)

    weights = {"tok_embd": get("token_embd.weight"), "out_norm": get("output_norm.weight")}
    if not cfg.tied_output:
        weights["w_out"] = get("output.weight")
    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w = {
            "attn_norm": get(p + "attn_norm.weight"),
            "wqkv": cat(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
            "wo": get(p + "attn_output.weight"),
            "ffn_norm": get(p + "ffn_norm.weight"),
            "w_gate_up": cat(p + "ffn_gate.weight", p + "ffn_up.weight"),
            "w_down": get(p + "ffn_down.weight"),
        }
        if cfg.qkv_bias:
            w["bqkv"] = cat(p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias")
        if cfg.qk_norm:
            w["q_norm"] = get(p + "attn_q_norm.weight")
            w["k_norm"] = get(p + "attn_k_norm.weight")
        layers.append(w)
    return Transformer(cfg, weights, layers, max_pos, device)
