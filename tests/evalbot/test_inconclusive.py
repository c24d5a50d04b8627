"""INCONCLUSIVE: a measurement that cannot resolve the smallest tier decides nothing about the PR.

Simulated evaluations of a PR with a true gain of 0, at per-pair noise from 0.5% to 5%, through the
real adaptive stopping (evalbot.stats) and the real verdict: none may earn a tier or a REJECT. A noisy
box yields INCONCLUSIVE (measured again), a quiet one "PASS, no tier".
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from evalbot import stats
from evalbot.model import AccuracyResult, Measurements, Provenance, Status, ThroughputPairs
from evalbot.rules import default_rules_dir, load_rules
from evalbot.verdict import decide

RULES = load_rules(default_rules_dir())
CPU = RULES.profile("cpu")
TRIALS = 600


def _measure(rng: random.Random, noise: float, gain: float) -> tuple[tuple[float, float], ...]:
    m = CPU.measurement

    def pair() -> tuple[float, float]:
        base = 10.0 * math.exp(rng.gauss(0, 0.01))  # drift both sides share
        return base, base * (1 + gain) * math.exp(rng.gauss(0, noise))

    return stats.run_adaptive(pair, target_half_width=m.ci_half_width, min_pairs=m.min_pairs,
                              max_pairs=m.max_pairs).pairs


def _evaluation(rng: random.Random, noise: float, gain: float = 0.0) -> Measurements:
    prov = Provenance(repo="r", base_sha="a" * 40, head_sha="b" * 40, harness_sha="a" * 40,
                      rules_hash=RULES.rules_hash, profile="cpu")
    tps = tuple(ThroughputPairs("m", c.ctx, "decode_tps", _measure(rng, noise, gain), guarded=c.guarded,
                                scored=c.scored) for c in CPU.contexts)
    return Measurements(provenance=prov, throughput=tps, accuracy=(AccuracyResult("m", 128, 0.99, 0.001, 1.0),))


@pytest.mark.parametrize("noise", [0.005, 0.01, 0.02, 0.03, 0.05])
def test_a_true_gain_of_zero_never_earns_a_tier_or_a_reject(noise):
    rng = random.Random(int(noise * 1e4))
    outcomes: Counter[str] = Counter()
    for _ in range(TRIALS):
        v = decide(_evaluation(rng, noise), RULES)
        assert v.tier is None and v.status is not Status.REJECT, (noise, v.reasons)
        outcomes[v.status.value] += 1
    assert set(outcomes) <= {"PASS", "INCONCLUSIVE"}
    if noise <= 0.01:  # a quiet box resolves +2% and says "no tier"
        assert outcomes["PASS"] == TRIALS
    if noise >= 0.05:  # a noisy one cannot, and says so instead of guessing
        assert outcomes["INCONCLUSIVE"] >= 0.95 * TRIALS


def test_a_real_gain_on_a_quiet_box_still_earns_its_tier():
    rng = random.Random(7)
    tiers = Counter(decide(_evaluation(rng, 0.005, gain=0.05), RULES).tier for _ in range(100))
    assert tiers["S"] >= 95  # +5%: the lower bound clears S's 3.5% almost always


def test_inconclusive_is_infra_class_with_its_own_label():
    v = decide(_evaluation(random.Random(3), 0.08), RULES)
    assert v.status is Status.INCONCLUSIVE and v.tier is None
    assert v.labels_add == (RULES.labels.inconclusive,)
    assert RULES.labels.verified in v.labels_remove and RULES.labels.regression in v.labels_remove
    assert all("measured again" in r and "MDE" in r for r in v.reasons)


def test_a_correctness_failure_still_rejects_on_a_noisy_box():
    m = _evaluation(random.Random(4), 0.08)
    m = Measurements(provenance=m.provenance, throughput=m.throughput,
                     accuracy=(AccuracyResult("m", 128, 0.5, 0.9, 3.0),))
    v = decide(m, RULES)
    assert v.status is Status.REJECT and RULES.labels.accuracy_fail in v.labels_add


def test_a_settled_top_tier_is_not_inconclusive_however_few_the_pairs():
    """+460% on a noisy box (the demo's int8 patch): no further pair could lower the top tier."""
    rng = random.Random(5)
    v = decide(_evaluation(rng, 0.04, gain=4.6), RULES)
    assert v.status is Status.PASS and v.tier == RULES.tiers[-1].name
    assert max(e.mde for e in v.estimates) > RULES.tiers[0].lower_bound


def test_a_regression_as_large_as_the_top_tier_is_settled_however_noisy():
    v = decide(_evaluation(random.Random(6), 0.05, gain=-0.6), RULES)
    assert v.status is Status.REJECT and RULES.labels.regression in v.labels_add
    assert max(e.mde for e in v.estimates if e.metric == "decode_tps") > RULES.tiers[0].lower_bound
