"""The speculative runs, spread over the A/B's blocks: each block a fresh pair of serving processes, so no one
process pair's offset goes into every run; each run on a prompt the processes running it never saw; and the
spec rate's interval widened where the blocks do explain the runs (a process offset shared by a block's runs
is not a gain)."""

from __future__ import annotations

import math

import pytest

from evalbot import stats
from evalbot.evaluate import ab_samples, speculative
from evalbot.model import Side


@pytest.mark.parametrize(("runs", "min_blocks"), [(16, 6), (3, 4), (6, 6), (16, 4), (3, 2), (5, 1)])
def test_the_runs_go_in_even_shares_to_blocks_one_to_min_blocks_less_one(runs: int, min_blocks: int):
    hosts = speculative.hosts(min_blocks)
    share = [speculative.due_by(b, runs, hosts) - speculative.due_by(b - 1, runs, hosts) for b in range(12)]
    assert share[0] == 0  # block 0: no earlier block, so no prompt its processes never saw
    assert sum(share) == runs and speculative.due_by(hosts, runs, hosts) == runs  # all by the last host
    hosting = [n for n in share[1 : hosts + 1]]
    assert max(hosting) - min(hosting) <= 1 and not any(share[hosts + 1 :])
    assert hosts == max(min_blocks - 1, 1)


def test_the_cpu_profiles_sixteen_runs_spread_over_five_blocks():
    hosts = speculative.hosts(6)
    assert [speculative.due_by(b, 16, hosts) for b in range(7)] == [0, 3, 6, 10, 13, 16, 16]


def _smp(side: Side, ctx: int, block: int, pair: int) -> ab_samples.Sample:
    return ab_samples.Sample(side, ctx, block, pair, (block, pair, ctx), (1, 2), 100.0, 10.0, {})


def test_a_run_takes_only_prompts_of_earlier_blocks_once_each_and_whole_pairs():
    samples = [
        _smp(s, c, b, p)
        for b in range(3)
        for p in range(2)
        for c in (128, 512)
        for s in (Side.BASE, Side.HEAD)
    ]
    samples.append(_smp(Side.BASE, 128, 0, 9))  # half a pair (its PR side was measured again)
    used: set[tuple[int, int]] = set()
    got = speculative.earlier_pairs(samples, 128, 2, used)
    assert [k for k, _ in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # never block 2's own, oldest first
    assert all(set(pair) == {Side.BASE, Side.HEAD} and pair[Side.BASE].context == 128 for _, pair in got)
    used.update(k for k, _ in got[:3])
    assert [k for k, _ in speculative.earlier_pairs(samples, 128, 2, used)] == [(1, 1)]
    assert speculative.earlier_pairs(samples, 128, 0, set()) == []


def test_clustered_runs_with_no_block_effect_read_as_independent_runs():
    rng = __import__("random").Random(5)
    pairs = [(10.0, 10.0 * math.exp(0.05 + rng.gauss(0, 0.1))) for _ in range(16)]
    blocks = [1 + i % 4 for i in range(16)]
    plain, clustered = stats.estimate(pairs), stats.estimate_clustered(pairs, blocks)
    assert clustered.ratio == pytest.approx(plain.ratio)
    assert clustered.half_width == pytest.approx(plain.half_width, rel=0.25)
    assert clustered.df >= 3


def test_a_process_offset_shared_by_a_blocks_runs_is_not_read_as_a_gain():
    """Equal code, each block's processes with an offset of their own (+4%, +3%, -1%, +5%) and the runs
    within a block close together: as independent runs, a gain that excludes 1.0 (what all runs on one
    block's processes gave, and what an A/A run could read as a tier); clustered, no gain."""
    offsets = {1: 0.04, 2: 0.03, 3: -0.01, 4: 0.05}
    pairs, blocks = [], []
    for b, off in offsets.items():
        for j in range(4):
            pairs.append((10.0, 10.0 * math.exp(off + 0.004 * (j - 1.5))))
            blocks.append(b)
    assert stats.estimate(pairs).ci_low > 1.0
    est = stats.estimate_clustered(pairs, blocks)
    assert est.ci_low < 1.0 < est.ci_high
    means = stats.estimate_blocked(pairs, blocks)  # the t-interval over the block means
    assert est.half_width == pytest.approx(means.half_width, rel=0.15)


def test_one_block_or_one_run_a_block_is_the_plain_estimate():
    pairs = [(10.0, 10.5), (10.0, 10.9), (10.0, 10.2), (10.0, 11.0)]
    for blocks in ([1, 1, 1, 1], [1, 2, 3, 4]):
        assert stats.estimate_clustered(pairs, blocks) == stats.estimate(pairs)
    with pytest.raises(stats.StatsError, match="cluster labels"):
        stats.estimate_clustered(pairs, [1, 2])
