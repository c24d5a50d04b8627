"""The kernel choice: only a candidate that passes its parity test at the shape may win, then the fastest."""

from __future__ import annotations

import time

import pytest
import torch

from engine import kernel_choice as kc
from engine import ops
from kernels import reference


def test_pick_takes_the_fastest_that_passed():
    trials = [
        kc.Trial("a", rel_err=1e-3, us=10.0),
        kc.Trial("b", rel_err=1e-3, us=7.0),
        kc.Trial("c", rel_err=1e-3, us=9.0),
    ]
    assert kc.pick(trials) == "b"


def test_pick_never_takes_a_fast_kernel_that_failed_parity_or_crashed():
    trials = [
        kc.Trial("wrong-but-fast", rel_err=0.3, error="parity: relative error 3.00e-01 > 5e-03"),
        kc.Trial("crashes", error="RuntimeError: illegal memory access"),
        kc.Trial("unsupported", error="unsupported: head dim 48"),
        kc.Trial("slow-but-right", rel_err=1e-3, us=50.0),
    ]
    assert kc.pick(trials) == "slow-but-right"
    # a failed trial carries no time that could win, even if a caller attached one
    assert not kc.Trial("x", rel_err=0.3, us=1.0, error="parity: bad").passed


def test_pick_near_tie_goes_to_the_preferred_candidate():
    trials = [kc.Trial("preferred", us=10.05), kc.Trial("other", us=10.0)]
    assert kc.pick(trials) == "preferred"  # within 1%: the order decides, so noise cannot flip it
    assert kc.pick([kc.Trial("preferred", us=10.5), kc.Trial("other", us=10.0)]) == "other"


def test_pick_with_nothing_passing_says_why():
    with pytest.raises(ValueError, match="a: parity: bad; b: unsupported: x"):
        kc.pick([kc.Trial("a", error="parity: bad"), kc.Trial("b", error="unsupported: x")])


def _decode_case(seed: int, b: int = 2, hq: int = 8, hkv: int = 2, d: int = 64, s_max: int = 96):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, hq, d, generator=g),
        torch.randn(b, hkv, s_max, d, generator=g),
        torch.randn(b, hkv, s_max, d, generator=g),
    )
    lengths = torch.tensor([s_max, 17][:b], dtype=torch.int32)
    k_nan, v_nan = k.clone(), v.clone()
    for i, n in enumerate(lengths.tolist()):
        k_nan[i, :, n:] = float("nan")
        v_nan[i, :, n:] = float("nan")
    want = reference.decode_attention(q, k, v, lengths, d**-0.5)
    return (q, k_nan, v_nan, lengths), want


def _wall_time(calls):  # the CPU stand-in for device_time_us: the median of a few timed passes
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for call in calls:
            call()
        times.append((time.perf_counter() - t0) * 1e6 / len(calls))
    return sorted(times)[1]


def test_run_trials_rejects_the_cheats_and_keeps_the_honest_kernel():
    case, want = _decode_case(1)
    scale = 64**-0.5

    def honest(q, k, v, n, out):
        return out.copy_(reference.decode_attention(q, k, v, n, scale))

    def ignores_lengths(q, k, v, n, out):  # reads the whole cache: the poisoned positions leak in
        full = torch.full_like(n, k.shape[2])
        return out.copy_(reference.decode_attention(q, k, v, full, scale))

    def leaves_a_head_unwritten(q, k, v, n, out):
        out[:, 1:] = reference.decode_attention(q, k, v, n, scale)[:, 1:]
        return out

    def slightly_wrong(q, k, v, n, out):  # skips every other position: fast, plausible, wrong
        return out.copy_(reference.decode_attention(q, k[:, :, ::2], v[:, :, ::2], (n + 1) // 2, scale))

    def returns_zeros(q, k, v, n, out):
        return out.zero_()

    def crashes(q, k, v, n, out):
        raise RuntimeError("an illegal memory access was encountered")

    candidates = [(name, fn, lambda *a: []) for name, fn in [
        ("ignores-lengths", ignores_lengths), ("unwritten", leaves_a_head_unwritten),
        ("slightly-wrong", slightly_wrong), ("zeros", returns_zeros), ("crashes", crashes), ("honest", honest)]]  # fmt: skip
    candidates.insert(0, ("unsupported", honest, lambda *a: ["head dim 64 not in (128,)"]))
    trials = kc.run_trials(candidates, [case], [want], 5e-3, time_fn=_wall_time)
    by = {t.name: t for t in trials}
    assert by["unsupported"].error == "unsupported: head dim 64 not in (128,)"
    assert "non-finite" in by["ignores-lengths"].error
    assert "non-finite" in by["unwritten"].error
    assert "relative error" in by["slightly-wrong"].error
    assert "relative error" in by["zeros"].error
    assert by["crashes"].error.startswith("RuntimeError: an illegal memory access")
    assert by["honest"].passed and by["honest"].rel_err < 1e-6 and by["honest"].us > 0
    assert [t.name for t in trials if t.passed] == ["honest"]
    assert kc.pick(trials) == "honest"


def test_parity_is_checked_on_every_case_not_just_the_first():
    cases, wants = zip(*(_decode_case(s) for s in (2, 3)), strict=True)
    scale = 64**-0.5
    seen = []

    def right_only_on_the_first_case(q, k, v, n, out):
        seen.append(1)
        ref = reference.decode_attention(q, k, v, n, scale)
        return out.copy_(ref if len(seen) == 1 else ref * 1.1)

    trials = kc.run_trials([("x", right_only_on_the_first_case, lambda *a: [])], list(cases), list(wants), 5e-3,
                           time_fn=_wall_time)  # fmt: skip
    assert not trials[0].passed and "relative error" in trials[0].error


def test_cpu_decode_takes_the_reference_without_measuring():
    q, k, v, lengths = _decode_case(4)[0]
    assert ops.decode_backend(q, k, v, lengths) == "torch-reference"
    assert ops._decode_choices == {}  # nothing measured, nothing cached on the CPU


def test_the_table_takes_the_first_that_passes_parity_and_times_nothing():
    # the engine's default: no candidate is timed, so every process of the same code picks the same kernel
    case, want = _decode_case(5)
    scale = 64**-0.5

    def honest(q, k, v, n, out):
        return out.copy_(reference.decode_attention(q, k, v, n, scale))

    def wrong(q, k, v, n, out):
        return out.zero_()

    ran = []

    def later(q, k, v, n, out):
        ran.append(1)
        return honest(q, k, v, n, out)

    def no_clock(calls):
        raise AssertionError("the table must time nothing")

    candidates = [
        ("unsupported", honest, lambda *a: ["head dim 64 not in (128,)"]),
        ("wrong", wrong, lambda *a: []),
        ("first-right", honest, lambda *a: []),
        ("later", later, lambda *a: []),
    ]
    trials = kc.run_trials(candidates, [case], [want], 5e-3, time_fn=None)
    assert [t.name for t in trials] == ["unsupported", "wrong", "first-right"] and not ran
    assert kc.first_passed(trials) == "first-right" and trials[-1].us is None
    assert kc.run_trials(candidates, [case], [want], 5e-3, time_fn=_wall_time)[-1].name == "later"
    with pytest.raises(ValueError, match="no kernel passed"):
        kc.first_passed(trials[:2])
    # a clock handed in is used (and a clock that fails fails the candidate, never the choice)
    timed = kc.run_trials(candidates[2:3], [case], [want], 5e-3, time_fn=no_clock)
    assert "the table must time nothing" in timed[0].error


def test_the_decode_table_puts_the_measured_batch_one_winner_first():
    # H200, 2026-12-04 (docs/benchmarks.md): at batch 1 Triton's split-KV kernel beat the cluster kernel at
    # every shape timed; the torch reference is the fallback of last resort
    assert ops.DECODE_KERNELS == ("triton-flash-decode", "cuda-cluster-decode", "torch-reference")
    assert [name for name, _, _ in ops._decode_candidates(1.0)] == list(ops.DECODE_KERNELS)
    assert ops.BY_TIMING not in ops.DECODE_KERNELS


def test_the_pinned_compile_applies_every_setting_on_this_torch():
    from engine.model import PINNED_INDUCTOR, compile_options

    # a torch that renamed one of them would silently tune again: every one must be known here
    assert compile_options("pinned") == PINNED_INDUCTOR
    assert compile_options("measured") == {}
    assert compile_options("pinned", known=["deterministic"]) == {"deterministic": True}
    with pytest.raises(ValueError, match="unknown tuning 'fast'"):
        compile_options("fast")
    # torch.compile takes them as Inductor options (an unknown one would raise at compile)
    f = torch.compile(lambda x: x.relu() + 1, dynamic=False, options=compile_options("pinned"))
    assert torch.equal(f(torch.tensor([-1.0, 2.0])), torch.tensor([1.0, 3.0]))
