"""The CI over process blocks: pairs measured in one pair of serving processes share those processes'
offsets, so the interval must treat blocks as clusters. Shown by simulation at realistic noise: a
within-process per-pair noise of 0.5-2% and a between-process offset of 0.2-1%."""

from __future__ import annotations

import math
import random

import pytest

from evalbot import stats

TRUE = 1.03
SIMS = 1500


def _run(rng: random.Random, blocks: int, per_block: int, within: float, between: float):
    pairs, labels = [], []
    for b in range(blocks):
        offset = rng.gauss(0, between)  # this block's head process vs main process, in log units
        for _ in range(per_block):
            base = 10.0 * math.exp(rng.gauss(0, 0.02))  # drift both sides share
            pairs.append((base, base * TRUE * math.exp(offset + rng.gauss(0, within))))
            labels.append(b)
    return pairs, labels


@pytest.mark.parametrize(
    ("within", "between", "blocks", "per_block"),
    [
        (0.005, 0.002, 4, 8),
        (0.01, 0.005, 6, 3),
        (0.02, 0.01, 5, 4),
        (0.01, 0.0, 4, 6),
    ],
)
def test_blocked_intervals_cover_the_true_ratio(within, between, blocks, per_block):
    rng = random.Random(hash((within, between, blocks)) & 0xFFFF)
    covered = sum(
        e.ci_low <= TRUE <= e.ci_high
        for e in (stats.estimate_blocked(*_run(rng, blocks, per_block, within, between)) for _ in range(SIMS))
    )
    assert covered / SIMS >= 0.94, covered / SIMS  # nominal 95%, with Monte Carlo error of about 0.6%


def test_ignoring_the_blocks_undercovers_when_processes_differ():
    rng = random.Random(11)
    naive = sum(
        e.ci_low <= TRUE <= e.ci_high
        for e in (stats.estimate(_run(rng, 4, 8, 0.005, 0.01)[0]) for _ in range(SIMS))
    )
    assert naive / SIMS < 0.8  # why the verdict uses estimate_blocked


def test_one_block_falls_back_to_pairs_and_labels_must_match():
    pairs = [(10.0, 10.3), (10.0, 10.2), (10.1, 10.4)]
    assert stats.estimate_blocked(pairs, [0, 0, 0]) == stats.estimate(pairs)
    with pytest.raises(stats.StatsError):
        stats.estimate_blocked(pairs, [0, 1])
