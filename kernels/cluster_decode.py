"""Split-KV decode attention in CUDA C++ whose splits merge through thread-block-cluster shared memory.

The kernel (``kernels/cuda/flash_decode_cluster.cu``) gives each (sequence, KV head) ``num_clusters``
clusters of ``num_splits`` CTAs; each CTA streams its tiles of K and V through TMA into shared memory,
serves the whole GQA group on the tensor cores, and each cluster merges its partial softmax states
through distributed shared memory. With one cluster a head that is the output: no second kernel and
no round trip through HBM. A cluster must sit in one GPC, so few large clusters fit at once (an H200
holds 7 of 10-16 CTAs, 64 of 2); with several clusters a head, the last CTA of each rank to arrive folds
the clusters' merged states from a small L2-resident workspace, in the same launch. It needs a Hopper
GPU (sm_90) and nvcc: it is built on first use as a torch C++/CUDA extension. Where either is
missing, ``unavailable_reason`` says why, and ``engine.ops`` falls back to Triton, then to PyTorch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, TypedDict, Unpack

import torch

from kernels.decode_inputs import input_reasons, well_formed

KERNEL = "cuda-cluster-decode"
HEAD_DIMS = (64, 128, 256)
MAX_GQA_RATIO = 16  # the query group is padded to 16 mma rows
MAX_CLUSTER = 16  # Hopper's largest (non-portable) cluster
# splits a head: more cost more than they gain (33 a head at d256 measured slower than 16 on the H200)
MAX_SPLITS = 16
# the largest cluster split_plan uses: 8 is the portable cluster size; a cluster of 16 a head measured
# slower than 16 CTAs merged through L2 at 16k and 32k (H200, d256), and clusters of 9-16 do not all
# fit at once for 8 KV heads
MAX_DSMEM_CLUSTER = 8
# the workspace of the cross-cluster merge, per device: slots of [16 rows][256 cols] float32 (one per
# cluster of a launch; the heuristic uses at most one per SM), and counter rows of 16 (one per sequence
# and KV head)
WORKSPACE_SLOTS = 512
WORKSPACE_HEADS = 512
BLOCK_N = 64  # positions per K/V tile
MIN_TILES_PER_SPLIT = 4  # fewer and the TMA pipeline has nothing to overlap
# head dim -> the (stages, consumer groups) instantiated in the .cu file; the first is the default. A
# stage holds one K and one V tile (16 KiB each at d128); with one CTA per SM the ring may fill most of
# the 227 KiB. A group is four consumer warps on one tile; two groups keep two tiles in compute at once.
CONFIGS = {64: ((8, 2), (4, 1)), 128: ((6, 2), (4, 2), (6, 1), (3, 1)), 256: ((3, 1), (2, 1))}
# measured on the H200 (docs/benchmarks.md): launched early, a call's clusters wait on SMs the previous
# call still needs; 0.5-12 us slower at batch 1, within 0.6% at batch 8
PDL_DEFAULT = False
# how a tile travels: 0 = one TMA box per 64 elements of the head dim ([D/64][64 positions][128 B] in shared
# memory), 1 = one box per tile ([64 positions][D/64][128 B]); and the L2 promotion of its reads
# (0 none, 1 64 B, 2 128 B, 3 256 B)
# (measured on the H200: 128-byte promotion 1-17% faster than 256-byte at batch 8, within 0.3 us at batch 1)
LAYOUT_DEFAULT = 0
L2_PROMOTION_DEFAULT = 2
# which tiles a split takes: 0 = tiles rank, rank + C, ... (its CTAs end close together), 1 = a contiguous run
ORDER_DEFAULT = 0

_SOURCES = ("flash_decode_cluster.cu", "binding.cpp")
_CUDA_DIR = Path(__file__).resolve().parent / "cuda"
# an -arch flag of ours replaces torch's own (one -gencode per TORCH_CUDA_ARCH_LIST entry): one target, once
_CUDA_FLAGS = ("-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas=-v", "-lineinfo")


class SplitPlan(NamedTuple):
    """How one (sequence, KV head) is split: ``clusters`` clusters of ``cluster`` CTAs."""

    cluster: int  # CTAs a cluster, merged through distributed shared memory (1 to 16)
    clusters: int  # clusters a (sequence, KV head), merged through the L2 workspace (1 to 128)

    @property
    def splits(self) -> int:
        return self.cluster * self.clusters


def split_plan(
    num_sms: int,
    batch: int,
    num_kv_heads: int,
    ctx_len: int,
    head_dim: int,
    max_active_clusters: Mapping[int, int] | None = None,
) -> SplitPlan:
    """The split of each (sequence, KV head) for one launch (pure).

    S splits a head: as many as fill the SMs once (at most one CTA per SM: a CTA fills an SM's shared
    memory), each keeping MIN_TILES_PER_SPLIT tiles, at most MAX_SPLITS. One cluster of S CTAs a head
    (merged through distributed shared memory, no workspace) when S <= MAX_DSMEM_CLUSTER and every
    cluster of the launch stays resident (``max_active_clusters``: size -> clusters that fit at once,
    as the device reports; None: all fit); otherwise S clusters of one CTA merged through the L2
    workspace. Measured on the H200 (docs/benchmarks.md): at batch 1 that beats one cluster of 9 (the
    largest that fits 8 times) and 8 clusters of 2 at every context, one cluster of 16 at 16k and 32k
    (d256), and 33 CTAs a head; at batch 8 clusters of 2 beat Triton at d128.
    """
    tiles = max(1, -(-ctx_len // BLOCK_N))
    heads = max(1, batch * num_kv_heads)
    splits = min(MAX_SPLITS, max(1, num_sms // heads), max(1, tiles // MIN_TILES_PER_SPLIT))
    if splits == 1:
        return SplitPlan(1, 1)
    fits = max_active_clusters is None or max_active_clusters.get(splits, 0) >= heads
    if splits <= MAX_DSMEM_CLUSTER and fits:
        return SplitPlan(splits, 1)
    return SplitPlan(1, splits)


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def _source_digest() -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((_CUDA_DIR / name).read_bytes())
    h.update(" ".join(_CUDA_FLAGS).encode())
    return h.hexdigest()[:12]


@functools.cache
def _build() -> tuple[ModuleType | None, str | None]:
    """The built extension, or the reason there is none (built once per process, cached on disk by torch)."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return None, "no CUDA device (or a CPU build of torch)"
    if _nvcc() is None:
        return None, "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    if shutil.which("ninja") is None:
        try:
            importlib.import_module("ninja")  # the pip package puts the binary beside the interpreter
        except ImportError:
            return None, "ninja not found (torch's extension builder needs it)"
    from torch.utils import cpp_extension

    try:
        module = cpp_extension.load(
            name=f"evalbot_cluster_decode_{_source_digest()}",
            sources=[str(_CUDA_DIR / name) for name in _SOURCES],
            extra_cuda_cflags=list(_CUDA_FLAGS),
            extra_cflags=["-O2"],
        )
    except Exception as exc:  # a failed build is a reason to fall back, never a crash of the engine
        return None, f"build failed: {type(exc).__name__}: {str(exc)[-600:]}"
    return module, None


def unavailable_reason(device: torch.device) -> str | None:
    """Why the kernel cannot run on this device (None when it can); builds the extension on first call."""
    if device.type != "cuda":
        return f"device {device.type} is not CUDA"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return (
            f"compute capability {torch.cuda.get_device_capability(device)} is not 9.0 (the kernel is sm_90a)"
        )
    why = _build()[1]
    if why is None:
        workspace(device)  # allocated here, before any launch could be inside a CUDA-graph capture
    return why


def _module() -> ModuleType:
    module, reason = _build()
    if module is None:
        raise RuntimeError(f"{KERNEL} unavailable: {reason}")
    return module


def unsupported_reasons(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor
) -> list[str]:
    """Why `flash_decode` cannot take these inputs; empty when it can (builds the extension if needed)."""
    reasons = input_reasons(q, k_cache, v_cache, lengths, HEAD_DIMS, MAX_GQA_RATIO)
    if not well_formed(q, k_cache):
        return reasons
    for name, t in (("k", k_cache), ("v", v_cache)):  # the tensor map's terms: 16-byte base and strides
        if t.data_ptr() % 16 or any(t.stride(i) * t.element_size() % 16 for i in range(3) if t.shape[i] > 1):
            reasons.append(f"{name} cache base or strides are not multiples of 16 bytes")
    if not reasons:
        why = unavailable_reason(q.device)
        if why:
            reasons.append(why)
    return reasons


@functools.cache
def max_active_clusters(
    device: torch.device, dtype: torch.dtype, head_dim: int, stages: int, groups: int
) -> dict[int, int]:
    """Clusters of each size (1 to 16) that the device holds at once for this kernel, as it reports them."""
    code = 0 if dtype == torch.bfloat16 else 1
    with torch.cuda.device(device):
        module = _module()
        return {c: int(module.max_active_clusters(code, head_dim, stages, groups, c)) for c in range(1, 17)}


_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cross-cluster merge's buffers on a device: (states, max and sum, arrival counters, no stamps).

    One set per device, allocated on first use and shared by every launch on it, so launches with
    several clusters a head must be ordered on one stream, as the engine's are. The counters start at
    zero and each launch leaves them at zero. It must not first be allocated inside a CUDA-graph
    capture (the graph's private pool would own it): `unavailable_reason` allocates it beforehand.
    """
    device = torch.device(
        device.type, device.index if device.index is not None else torch.cuda.current_device()
    )
    if device not in _workspaces:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{KERNEL}: first launch on {device} inside a CUDA-graph capture; launch once (or call "
                "unavailable_reason) before capturing, so the merge workspace is not owned by the graph"
            )
        with torch.cuda.device(device):
            _workspaces[device] = (
                torch.zeros(WORKSPACE_SLOTS * 16 * max(HEAD_DIMS), dtype=torch.float32, device=device),
                torch.zeros(WORKSPACE_SLOTS * MAX_CLUSTER * 16 * 2, dtype=torch.float32, device=device),
                torch.zeros(WORKSPACE_HEADS * MAX_CLUSTER, dtype=torch.int32, device=device),
                torch.empty(0, dtype=torch.int64, device=device),
            )
    return _workspaces[device]


@functools.cache
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


class Tuning(TypedDict, total=False):
    """Launch overrides (None or absent: the default): the stages and consumer groups instantiated for the
    head dim (`CONFIGS`), programmatic dependent launch, the tile layout, the L2 promotion and the tile order."""

    stages: int | None
    groups: int | None
    pdl: bool | None
    layout: int | None
    l2_promotion: int | None
    order: int | None


def decode_config(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    *,
    num_splits: int | None = None,
    num_clusters: int | None = None,
    **tuning: Unpack[Tuning],
) -> dict[str, int | str | bool]:
    """The settings `flash_decode` uses for these shapes (for the engine's `config` record).

    ``num_splits`` is the CTAs a cluster and ``num_clusters`` the clusters a (sequence, KV head); either
    left out comes from `split_plan` (``num_splits`` alone given: one cluster a head).
    """
    b, _, d = q.shape
    hkv, s_max = k_cache.shape[1], k_cache.shape[2]
    stages = tuning.get("stages") or CONFIGS[d][0][0]
    groups = tuning.get("groups") or next((g for s, g in CONFIGS[d] if s == stages), CONFIGS[d][0][1])
    pdl, layout = tuning.get("pdl"), tuning.get("layout")
    l2_promotion, order = tuning.get("l2_promotion"), tuning.get("order")
    if num_splits is None:
        fits = max_active_clusters(q.device, q.dtype, d, stages, groups)
        plan = split_plan(sm_count(q.device), b, hkv, s_max, d, fits)
        num_splits = plan.cluster
        num_clusters = plan.clusters if num_clusters is None else num_clusters
        source = "heuristic" if num_clusters == plan.clusters else "override"
    else:
        num_clusters = 1 if num_clusters is None else num_clusters
        source = "override"
    return {
        "kernel": KERNEL,
        "num_splits": num_splits,
        "num_clusters": num_clusters,
        "splits_from": source,
        "block_n": BLOCK_N,
        "stages": stages,
        "groups": groups,
        "pdl": PDL_DEFAULT if pdl is None else bool(pdl),
        "layout": LAYOUT_DEFAULT if layout is None else int(layout),
        "l2_promotion": L2_PROMOTION_DEFAULT if l2_promotion is None else int(l2_promotion),
        "order": ORDER_DEFAULT if order is None else int(order),
        "smem_bytes": int(_module().smem_bytes(d, stages, groups)),
    }


def flash_decode(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lengths: torch.Tensor,  # [B] int32 on q's device, 1 <= lengths[b] <= S_max
    scale: float,
    *,
    num_splits: int | None = None,
    num_clusters: int | None = None,
    out: torch.Tensor | None = None,  # [B, Hq, D] in q's dtype
    probe: int = 0,  # diagnostics only: 1 streams the tiles and skips the attention (wrong output)
    stamps: torch.Tensor | None = None,  # diagnostics: int64 [CTAs * 16], bench/cluster_timeline.py
    **tuning: Unpack[Tuning],
) -> torch.Tensor:  # [B, Hq, D]
    """One-token GQA attention over the first lengths[b] cache positions, merged inside clusters."""
    cfg = decode_config(q, k_cache, num_splits=num_splits, num_clusters=num_clusters, **tuning)
    if out is None:
        out = torch.empty_like(q)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    ws_acc, ws_ml, counters, no_stamps = workspace(q.device)
    _module().launch(q, k_cache, v_cache, lengths, out, float(scale), cfg["num_splits"], cfg["num_clusters"],
                     ws_acc, ws_ml, counters, no_stamps if stamps is None else stamps, cfg["stages"], cfg["groups"],
                     cfg["pdl"], probe, cfg["layout"], cfg["l2_promotion"], cfg["order"], stream)  # fmt: skip
    return out
