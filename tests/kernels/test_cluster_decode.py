"""The cluster-merged CUDA decode kernel: its split heuristic and fallbacks here, its parity on the GPU.

On a machine without a Hopper GPU and nvcc the kernel cannot run; the tests here check that it says
why and that dispatch falls back. The ``gpu`` tests (run through the device tool on an H200) check
it against the float64 reference from ctx 1 to 32k, batch 1 and 8, at the GQA ratios of the
qwen2/qwen3 shapes, with NaN past every length, strided caches, and CUDA-graph replays.
"""

from __future__ import annotations

import pytest
import torch

from kernels import cluster_decode as cd
from kernels.reference import decode_attention

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)


# --- the split heuristic, on its own -------------------------------------------------------------


# clusters of each size an H200 holds at once with one CTA an SM, as cudaOccupancyMaxActiveClusters
# reported them for the default configs on 2026-12-03 (a cluster sits in one GPC)
H200_CLUSTERS = {1: 132, 2: 66, 3: 39, 4: 30, 5: 22, 6: 17, 7: 15, 8: 15, 9: 9, 10: 7, 11: 7, 12: 7, 13: 7,
                 14: 7, 15: 7, 16: 7}  # fmt: skip


def test_splits_examples_on_an_h200():
    # 132 SMs, batch 1, 8 KV heads (qwen3-8b): 16 CTAs a head (128 CTAs), merged in L2 beyond a cluster
    # of 8; short contexts keep 4 tiles a split; batch 8: clusters of 2 (128 CTAs); 256 heads fill the SMs
    ctxs = (1, 64, 256, 512, 1024, 4096, 16384, 32768)
    assert [cd.split_plan(132, 1, 8, c, 128) for c in ctxs] == [(1, 1)] * 3 + [(2, 1), (4, 1)] + [(1, 16)] * 3
    assert [cd.split_plan(132, 8, 8, c, 128) for c in ctxs] == [(1, 1)] * 3 + [(2, 1)] * 5
    assert [cd.split_plan(132, 1, 8, 256 * s, 128).splits for s in range(4, 10)] == [
        4,
        5,
        6,
        7,
        8,
        9,
    ]  # any size
    assert [cd.split_plan(132, 1, 8, 256 * s, 128)[0] for s in range(7, 10)] == [7, 8, 1]  # clusters to 8
    assert cd.split_plan(132, 1, 2, 32768, 64) == (1, 16)  # qwen2.5-0.5b, 2 KV heads: at most 16 a head
    assert cd.split_plan(132, 32, 8, 32768, 128).splits == 1


def test_plans_keep_every_cluster_resident_on_an_h200():
    assert cd.split_plan(132, 1, 8, 16384, 128, H200_CLUSTERS) == (1, 16)
    assert cd.split_plan(132, 1, 4, 16384, 256, H200_CLUSTERS) == (1, 16)
    assert cd.split_plan(132, 8, 8, 16384, 128, H200_CLUSTERS) == (2, 1)  # 64 clusters of 2 fit (66)
    assert cd.split_plan(132, 8, 4, 16384, 256, H200_CLUSTERS) == (1, 4)  # 32 clusters of 4 do not (30)
    assert cd.split_plan(132, 4, 8, 8192, 128, H200_CLUSTERS) == (1, 4)
    assert cd.split_plan(132, 16, 4, 8192, 128, H200_CLUSTERS) == (2, 1)
    assert cd.split_plan(132, 8, 8, 16384, 128, {c: 0 for c in H200_CLUSTERS}) == (1, 2)


@pytest.mark.parametrize("num_sms", [8, 78, 132])
@pytest.mark.parametrize("fits", [None, H200_CLUSTERS])
def test_plan_properties(num_sms, fits):
    for batch in (1, 3, 8, 64):
        for hkv in (1, 2, 4, 8):
            for d in cd.HEAD_DIMS:
                for ctx in (1, 63, 64, 65, 255, 256, 1000, 4096, 16448, 32768, 131072):
                    plan = cd.split_plan(num_sms, batch, hkv, ctx, d, fits)
                    s, heads = plan.splits, batch * hkv
                    tiles = -(-ctx // cd.BLOCK_N)
                    assert plan.cluster == 1 or plan.clusters == 1, "clusters, or the L2 merge, not both"
                    assert plan.cluster <= cd.MAX_DSMEM_CLUSTER and s <= cd.MAX_SPLITS
                    assert s == 1 or tiles // s >= cd.MIN_TILES_PER_SPLIT, "each split keeps enough tiles"
                    assert s == 1 or heads * s <= num_sms, "one wave, at most one CTA per SM"
                    assert plan.cluster == 1 or fits is None or fits[plan.cluster] >= heads, "all resident"
                    assert s == 1 or heads * plan.clusters <= cd.WORKSPACE_SLOTS, "the workspace holds it"
                    most = min(cd.MAX_SPLITS, num_sms // heads, tiles // cd.MIN_TILES_PER_SPLIT)
                    assert s == max(1, most), "as many splits as fill the SMs once"


def test_cpu_says_why_the_kernel_cannot_run():
    q = torch.randn(1, 8, 128, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)
    lengths = torch.ones(1, dtype=torch.int32)
    assert cd.unavailable_reason(q.device) == "device cpu is not CUDA"
    assert cd.unsupported_reasons(q, kv, kv, lengths) == ["device cpu is not CUDA"]
    reason = cd._build()[1]
    assert reason and ("no CUDA device" in reason or "nvcc" in reason)
    with pytest.raises(RuntimeError, match="cuda-cluster-decode unavailable"):
        cd._module()


def test_unsupported_shapes_are_named():
    q = torch.randn(1, 8, 128, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)
    lengths = torch.ones(1, dtype=torch.int32)

    def reasons(**kw):
        args = dict(q=q, k_cache=kv, v_cache=kv, lengths=lengths) | kw
        return " ".join(cd.unsupported_reasons(**args))

    assert "head dim 96" in reasons(q=q[..., :96], k_cache=kv[..., :96], v_cache=kv[..., :96])
    assert "GQA ratio 32" in reasons(q=torch.randn(1, 64, 128, dtype=torch.bfloat16))
    assert "not a multiple" in reasons(q=q[:, :7])
    assert "float32" in reasons(q=q.float(), k_cache=kv.float(), v_cache=kv.float())
    assert "dtypes differ" in reasons(v_cache=kv.half())
    assert "int32" in reasons(lengths=lengths.long())
    odd = torch.randn(1, 2, 64, 136, dtype=torch.bfloat16)[..., :128]  # 272-byte rows: a multiple of 16
    assert "16 bytes" not in reasons(k_cache=odd, v_cache=odd)
    shifted = torch.randn(1 * 2 * 64 * 128 + 4, dtype=torch.bfloat16)[4:].view(1, 2, 64, 128)  # base 8 B off
    assert "k cache base or strides are not multiples of 16 bytes" in reasons(k_cache=shifted)


@pytest.mark.skipif(CUDA, reason="the CPU's path")
def test_ops_falls_back_to_the_reference_on_the_cpu():
    from engine import ops

    q = torch.randn(1, 8, 64)
    kv = torch.randn(1, 2, 32, 64)
    assert ops.decode_backend(q, kv, kv, torch.full((1,), 32, dtype=torch.int32)) == "torch-reference"


# --- the GPU -------------------------------------------------------------------------------------

# (Hq, Hkv, D): the GQA ratios of the qwen2/qwen3 shapes
QWEN_HEADS = [
    (14, 2, 64),  # qwen2.5-0.5b (GQA 7)
    (12, 2, 128),  # qwen2.5-1.5b (GQA 6)
    (28, 4, 128),  # qwen2.5-7b (GQA 7)
    (16, 8, 128),  # qwen3-0.6b/1.7b (GQA 2)
    (32, 8, 128),  # qwen3-4b/8b (GQA 4)
    (40, 8, 128),  # qwen3-14b (GQA 5)
    (64, 8, 128),  # qwen3-32b, qwen2.5-72b (GQA 8)
    (24, 4, 256),  # GQA 6 at d256 (the kernel benchmark's third shape)
]

gpu = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")


def _inputs(b, hq, hkv, d, s_max, lengths, dtype, seed, layout="bhsd"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = 2 * torch.randn(b, hq, d, device="cuda", generator=g)
    k = torch.randn(b, hkv, s_max, d, device="cuda", generator=g)
    v = torch.randn(b, hkv, s_max, d, device="cuda", generator=g)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    n = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    valid = torch.arange(s_max, device="cuda")[None, :] < n[:, None]
    k_nan = k.masked_fill(~valid[:, None, :, None], float("nan"))  # never read past a length
    v_nan = v.masked_fill(~valid[:, None, :, None], float("nan"))
    if layout == "bshd":  # caches stored [B, S, Hkv, D] (strided views)
        k_nan = k_nan.transpose(1, 2).contiguous().transpose(1, 2)
        v_nan = v_nan.transpose(1, 2).contiguous().transpose(1, 2)
    return q, k, v, k_nan, v_nan, n


def _check(out, q, k, v, n, scale, what):
    ref = decode_attention(q.double(), k.double(), v.double(), n, scale)
    assert not out.isnan().any(), f"{what}: NaN in the output (unwritten, or read past a length)"
    err = (out.double() - ref).abs()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    tol = 5e-3 if q.dtype == torch.bfloat16 else 2e-3
    worst = divmod(int(err.flatten().argmax()), q.shape[-1])
    assert rel < tol, (
        f"{what}: relative error {rel:.2e}; worst element (row, col) {worst}, {err.max().item():.3e}"
    )


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("hq,hkv,d", QWEN_HEADS)
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("ctx", [1, 65, 1000, 4096, 16384, 32768])
def test_gpu_matches_reference(hq, hkv, d, batch, ctx):
    lengths = [ctx] + [max(1, (ctx * (7 + 13 * i)) % (ctx + 1)) for i in range(1, batch)]
    q, k, v, k_nan, v_nan, n = _inputs(batch, hq, hkv, d, ctx, lengths, torch.bfloat16, seed=ctx + batch + hq)
    out = torch.full_like(q, float("nan"))
    cd.flash_decode(q, k_nan, v_nan, n, d**-0.5, out=out)
    cfg = cd.decode_config(q, k)
    _check(out, q, k, v, n, d**-0.5,
           f"B={batch} ctx={ctx} {hq}/{hkv} d{d} clusters {cfg['num_clusters']} x {cfg['num_splits']}")  # fmt: skip
    assert not cd.workspace(q.device)[2].any(), "every arrival counter is back at zero"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("splits", [1, 2, 3, 4, 7, 8, 15, 16])
@pytest.mark.parametrize("config", [(d, s, g) for d, cs in cd.CONFIGS.items() for s, g in cs])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_every_split_config_and_dtype(splits, config, dtype):
    d, stages, groups = config
    hq, hkv, s_max = 8 if d == 256 else 16, 2, 3000
    lengths = [3000, 1, 130, 2999]
    q, k, v, k_nan, v_nan, n = _inputs(4, hq, hkv, d, s_max, lengths, dtype, seed=splits * 7 + d)
    out = torch.full_like(q, float("nan"))
    cd.flash_decode(
        q, k_nan, v_nan, n, 0.7 * d**-0.5, out=out, num_splits=splits, stages=stages, groups=groups
    )
    _check(out, q, k, v, n, 0.7 * d**-0.5, f"splits {splits} stages {stages} groups {groups} d{d} {dtype}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("plan", [(1, 2), (1, 16), (2, 8), (3, 5), (4, 4), (8, 2), (16, 3), (1, 64)])
@pytest.mark.parametrize("config", [(d, s, g) for d, cs in cd.CONFIGS.items() for s, g in cs])
@pytest.mark.parametrize("order", [0, 1])
def test_gpu_several_clusters_a_head(plan, config, order):
    # the merge through the L2 workspace: whole clusters empty (length 1, 130), the last arrival of each
    # rank, counters back at zero for the next launch; launched twice to catch a counter left behind
    d, stages, groups = config
    hq, hkv, s_max = 8 if d == 256 else 16, 2, 9000
    lengths = [9000, 1, 130, 8999]
    q, k, v, k_nan, v_nan, n = _inputs(4, hq, hkv, d, s_max, lengths, torch.bfloat16, seed=plan[0] * 31 + d)
    for attempt in range(2):
        out = torch.full_like(q, float("nan"))
        cd.flash_decode(q, k_nan, v_nan, n, d**-0.5, out=out, num_splits=plan[0], num_clusters=plan[1],
                        stages=stages, groups=groups, order=order)  # fmt: skip
        _check(
            out, q, k, v, n, d**-0.5, f"clusters {plan[1]} x {plan[0]} d{d} {stages}/{groups} try {attempt}"
        )
        assert not cd.workspace(q.device)[2].any(), "every arrival counter is back at zero"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("plan", [(1, 1), (9, 1), (2, 8), (1, 16)])
def test_gpu_stamps_follow_the_phases(plan):
    q, _, _, k, v, n = _inputs(1, 32, 8, 128, 4096, [4096], torch.bfloat16, seed=4)
    ctas = 8 * plan[0] * plan[1]
    stamps = torch.zeros(ctas * 16, dtype=torch.int64, device="cuda")
    out = cd.flash_decode(q, k, v, n, 0.1, num_splits=plan[0], num_clusters=plan[1], stamps=stamps)
    _check(out, q, k, v, n, 0.1, f"stamped {plan}")
    ns = stamps.view(ctas, 16)[:, :8].cpu()
    taken = [0, 1, 2, 3, 4, 7] + ([5, 6] if plan[0] > 1 else [])  # one CTA a cluster: no cluster step
    assert (ns[:, taken] > 0).all(), "every CTA stamps each phase it passes"
    assert (ns[:, 7] >= ns[:, 0]).all() and (ns[:, 4] >= ns[:, 3]).all()
    with pytest.raises(RuntimeError, match="stamps hold"):
        cd.flash_decode(q, k, v, n, 0.1, num_splits=plan[0], num_clusters=plan[1], stamps=stamps[:16])


@pytest.mark.gpu
@gpu
def test_gpu_workspace_limits_are_named():
    q, _, _, k, v, n = _inputs(8, 64, 8, 128, 4096, [4096] * 8, torch.bfloat16, seed=2)
    with pytest.raises(RuntimeError, match="workspace slots"):
        cd.flash_decode(q, k, v, n, 0.1, num_splits=1, num_clusters=16)  # 64 heads x 16 > 512 slots
    with pytest.raises(RuntimeError, match="num_clusters 129"):
        cd.flash_decode(q[:1], k[:1], v[:1], n[:1], 0.1, num_splits=1, num_clusters=129)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("l2", [0, 3])
@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("d", cd.HEAD_DIMS)
def test_gpu_tile_layouts_and_orders(layout, l2, order, d):
    q, k, v, k_nan, v_nan, n = _inputs(3, 8, 2, d, 2000, [2000, 70, 1999], torch.bfloat16, seed=d + layout)
    out = torch.full_like(q, float("nan"))
    cd.flash_decode(
        q, k_nan, v_nan, n, d**-0.5, out=out, layout=layout, l2_promotion=l2, order=order, num_splits=7
    )
    _check(out, q, k, v, n, d**-0.5, f"layout {layout} l2 {l2} order {order} d{d}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_gpu_strided_caches_and_query(pdl):
    lengths = [900, 17]
    q, k, v, k_nan, v_nan, n = _inputs(2, 32, 8, 128, 1024, lengths, torch.bfloat16, seed=5, layout="bshd")
    wide = torch.randn(2, 32, 256, device="cuda", dtype=torch.bfloat16)
    wide[..., :128] = q
    assert k_nan.stride(2) == 8 * 128 and not cd.unsupported_reasons(wide[..., :128], k_nan, v_nan, n)
    out = torch.full_like(q, float("nan"))
    cd.flash_decode(wide[..., :128], k_nan, v_nan, n, 0.1, out=out, pdl=pdl)
    _check(out, q, k, v, n, 0.1, f"strided, pdl={pdl}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (24, 4, 256), (14, 2, 64)])
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_cuda_graph_replay_follows_lengths(hq, hkv, d, batch):
    s_max = 8192
    q, k, v, _, _, n = _inputs(batch, hq, hkv, d, s_max, [s_max] * batch, torch.bfloat16, seed=9)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cd.flash_decode(q, k, v, n, d**-0.5, out=out)  # build and configure outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cd.flash_decode(q, k, v, n, d**-0.5, out=out)
    for lens in ([s_max, 1, 4000, 77], [5000, 8191, 64, 65], [1, 2, 3, 4]):
        n.copy_(torch.tensor(lens[:batch], dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        _check(out, q, k, v, n, d**-0.5, f"graph replay {lens}")


@pytest.mark.gpu
@gpu
def test_gpu_results_do_not_move_between_runs():
    # a race shows as an output that changes between launches on the same inputs
    q, _, _, k, v, n = _inputs(1, 32, 8, 128, 16384, [16384], torch.bfloat16, seed=3)
    first = cd.flash_decode(q, k, v, n, 128**-0.5)
    for _ in range(20):
        assert torch.equal(cd.flash_decode(q, k, v, n, 128**-0.5), first)


@pytest.mark.gpu
@gpu
def test_gpu_ops_chooses_among_kernels_that_passed():
    from engine import ops

    q, _, _, k, v, n = _inputs(1, 32, 8, 128, 4096, [4096], torch.bfloat16, seed=11)
    choice = ops.choose_decode_kernel(q, k, v, n, 128**-0.5, by_timing=True)
    by = {t.name: t for t in choice.trials}
    assert set(by) == set(ops.DECODE_KERNELS)
    assert by[choice.backend].passed and choice.how == "measured"
    fastest = min(t.us for t in choice.trials if t.passed)
    assert by[choice.backend].us <= fastest * 1.01 + 1e-9
    assert ops.decode_backend(q, k, v, n, kernel=ops.BY_TIMING) == choice.backend  # cached per shape
    table = ops.choose_decode_kernel(q, k, v, n, 128**-0.5)  # the default: the table, nothing timed
    assert table.how == "table" and table.backend == ops.DECODE_KERNELS[0]
    assert all(t.us is None for t in table.trials) and ops.decode_backend(q, k, v, n) == table.backend


class _Binding:
    """Stands in for the built extension: takes exactly the binding's arguments and records each launch."""

    def __init__(self):
        self.launches = []

    def launch(self, q, k, v, lengths, out, scale, num_splits, num_clusters, ws_acc, ws_ml, counters, stamps,
               stages, groups, pdl, probe, layout, l2, order, stream):  # fmt: skip
        assert stamps.dtype == torch.int64
        assert isinstance(scale, float) and isinstance(pdl, bool) and isinstance(stream, int)
        assert layout in (0, 1) and l2 in (0, 1, 2, 3) and order in (0, 1)
        assert (ws_acc.dtype, ws_ml.dtype, counters.dtype) == (torch.float32, torch.float32, torch.int32)
        assert ws_acc.numel() == cd.WORKSPACE_SLOTS * 16 * 256 and counters.numel() == cd.WORKSPACE_HEADS * 16
        self.launches.append(dict(num_splits=num_splits, num_clusters=num_clusters, stages=stages, groups=groups,
                                  pdl=pdl, probe=probe))  # fmt: skip

    def max_active_clusters(self, dtype, head_dim, stages, groups, cluster):
        return H200_CLUSTERS[cluster]

    def smem_bytes(self, head_dim, stages, groups):
        return 1000 * stages + groups


def test_python_layer_hands_the_binding_its_arguments(monkeypatch):
    # the glue between torch and the extension, exercised without a GPU: every instantiated config,
    # the device's cluster limits reaching the heuristic, and the defaults
    binding = _Binding()
    monkeypatch.setattr(cd, "_build", lambda: (binding, None))
    monkeypatch.setattr(cd, "sm_count", lambda device: 132)
    ws = (
        torch.zeros(cd.WORKSPACE_SLOTS * 16 * 256),
        torch.zeros(cd.WORKSPACE_SLOTS * 16 * 16 * 2),
        torch.zeros(cd.WORKSPACE_HEADS * 16, dtype=torch.int32),
        torch.empty(0, dtype=torch.int64),
    )
    monkeypatch.setattr(cd, "workspace", lambda device: ws)
    cd.max_active_clusters.cache_clear()
    monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())

    class _Stream:
        cuda_stream = 1234

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    q = torch.empty(1, 32, 128, dtype=torch.bfloat16)
    k = torch.empty(1, 8, 16384, 128, dtype=torch.bfloat16)
    n = torch.full((1,), 16384, dtype=torch.int32)
    cfg = cd.decode_config(q, k)
    stages, groups = cd.CONFIGS[128][0]
    # one cluster of 16 a head would be wanted, but the device holds only 7 such: 16 CTAs merged in L2
    want = {"num_splits": 1, "num_clusters": 16, "stages": stages, "groups": groups, "pdl": cd.PDL_DEFAULT}
    assert cfg | want | {"splits_from": "heuristic"} == cfg
    assert cfg["smem_bytes"] == 1000 * stages + groups
    for d, configs in cd.CONFIGS.items():
        for stages, groups in configs:
            qd, kd = (
                torch.empty(2, 8, d, dtype=torch.bfloat16),
                torch.empty(2, 2, 4096, d, dtype=torch.bfloat16),
            )
            cd.flash_decode(
                qd, kd, kd, n.repeat(2), 0.1, stages=stages, groups=groups, num_splits=4, pdl=True
            )
            assert binding.launches[-1] == dict(
                num_splits=4, num_clusters=1, stages=stages, groups=groups, pdl=True, probe=0
            )
    cd.flash_decode(q, k, k, n, 0.1)
    assert binding.launches[-1] == dict(num_splits=1, num_clusters=16, stages=cd.CONFIGS[128][0][0],
                                        groups=cd.CONFIGS[128][0][1], pdl=cd.PDL_DEFAULT, probe=0)  # fmt: skip
    cd.flash_decode(q, k, k, n, 0.1, num_clusters=3)  # clusters given, CTAs a cluster from the plan
    assert binding.launches[-1] | {"num_splits": 1, "num_clusters": 3} == binding.launches[-1]
    assert cd.decode_config(q, k, num_clusters=3)["splits_from"] == "override"
    cd.max_active_clusters.cache_clear()


def _bench(name: str):
    """A bench/ script imported as a module (bench/ is scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_names_plans_as_clusters_of_ctas():
    bench = _bench("flash_decode")
    assert bench._cluster_plan("9") == (9, 1) and bench._cluster_plan("2x8") == (2, 8)
    assert bench._plan_cell({"num_splits": 2, "num_clusters": 8}) == "2x8"
    assert bench._plan_cell({"num_splits": 9, "num_clusters": 1}) == "9"
    assert bench._plan_cell({"num_splits": 9}) == "9"  # records from before K existed


def test_timeline_summary_from_stamps():
    bench = _bench("cluster_timeline")

    def cta(t0, phases_ns, clock_scale=2):  # a CTA's stamps: 8 timer values then 8 clock values
        ts = [t0 + p if p is not None else 0 for p in phases_ns]
        return ts + [int((t - t0) * clock_scale) + 5 if t else 0 for t in ts]

    # two calls of two CTAs; the second call starts 1 µs after the first one's last CTA left
    steps = [0, 500, 1500, 9500, 9700, 9900, None, 10500]  # a CTA that skips "cluster merged"
    first = [cta(1000, steps), cta(1200, steps)]
    second = [cta(12700, steps), cta(13000, steps)]
    s = bench.summarize([first, second], tuple(f"p{i}" for i in range(8)))
    assert len(bench.PHASES) == 8  # the kernel's eight stamps
    assert s["calls"] == 1
    assert s["gap_us"] == 1.0 and s["start_spread_us"] == 0.3 and s["cta_us"] == 10.5
    assert s["period_us"] == pytest.approx(11.8)
    assert s["phase_us"]["p2"] == 1.0 and s["phase_us"]["p3"] == 8.0
    assert s["phase_us"]["p7"] == 0.6  # from the last phase stamped before it
    assert s["sm_clock_mhz"] == pytest.approx(2000.0)
    assert s["stream_end_spread_us"] == 0.15 and s["last_epilogue_us"] == 1.0  # streams end at 9.5 µs
    assert "| 4096 |" in bench.table([{"ctx": 4096, "plan": "2x8", "probe": 0, "ctas": 128, **s}])
