"""INCONCLUSIVE: a measurement that cannot resolve the smallest tier decides nothing about the PR.

Simulated evaluations of a PR with a true gain of 0, at per-pair noise from 0.5% to 5%, sampled until
the profile's CI half-width (or its max pairs) and judged by the real verdict: none may earn a tier or a
REJECT. A noisy box yields INCONCLUSIVE (measured again), a quiet one "PASS, no tier".
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from evalbot.model import AccuracyResult, Measurements, Provenance, Status, ThroughputPairs
from evalbot.rules import Rules, default_rules_dir, load_rules
from evalbot.verdict.decide import decide
from tests.evalbot.test_stats import sample_until_precise

RULES = load_rules(default_rules_dir())
CPU = RULES.profile("cpu")
TRIALS = 600


def _measure(rng: random.Random, noise: float, gain: float) -> tuple[tuple[float, float], ...]:
    m = CPU.measurement

    def pair() -> tuple[float, float]:
        base = 10.0 * math.exp(rng.gauss(0, 0.01))  # drift both sides share
        return base, base * (1 + gain) * math.exp(rng.gauss(0, noise))

    return tuple(
        sample_until_precise(
            pair, target_half_width=m.ci_half_width, min_pairs=m.min_pairs, max_pairs=m.max_pairs
        )
    )


def _evaluation(rng: random.Random, noise: float, gain: float = 0.0) -> Measurements:
    prov = Provenance(
        repo="r",
        base_sha="a" * 40,
        head_sha="b" * 40,
        harness_sha="a" * 40,
        rules_hash=RULES.rules_hash,
        profile="cpu",
    )
    tps = tuple(
        ThroughputPairs(
            "m", c.ctx, "decode_tps", _measure(rng, noise, gain), guarded=c.guarded, scored=c.scored
        )
        for c in CPU.contexts
    )
    return Measurements(
        provenance=prov, throughput=tps, accuracy=(AccuracyResult("m", 128, 0.99, 0.001, 1.0),)
    )


@pytest.mark.parametrize("noise", [0.005, 0.01, 0.02, 0.03, 0.05, 0.15])
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
    assert all("measured again" in r and "MDE" in r for r in v.reasons)


def test_a_correctness_failure_still_rejects_on_a_noisy_box():
    m = _evaluation(random.Random(4), 0.08)
    m = Measurements(
        provenance=m.provenance, throughput=m.throughput, accuracy=(AccuracyResult("m", 128, 0.5, 0.9, 3.0),)
    )
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


def test_a_regression_read_too_imprecisely_to_stand_is_inconclusive_not_a_reject():
    """Equal code on a very noisy box reads a CI wholly below 0.98 in about 1 run of 300: without an MDE's
    margin below 1 that is luck, not a slowdown (found by the zero-gain simulation at 15% noise)."""
    v = _decide(_fixed(128, 1.0, 0.004), _fixed(512, 0.91, 0.1))
    by = {e.context: e for e in v.estimates}
    assert by[512].ci_high < RULES.gates.no_regression.min_ratio and by[512].ci_high * (1 + by[512].mde) > 1
    assert v.status is Status.INCONCLUSIVE and RULES.labels.regression not in v.labels_add


def test_a_precise_but_shallow_prefill_slowdown_is_inconclusive_and_says_why():
    """Prefill (guarded, not scored) reads 0.955x [0.93, 0.977] at an MDE of 3%: not an MDE below 1, so no
    REJECT, and the reason names the slowdown, not a tier floor it has nothing to do with."""
    d = [math.log(0.955) + 0.0335 * (1 if i % 2 else -1) for i in range(12)]
    prefill = ThroughputPairs(
        "m", 512, "prefill_tps", tuple((10.0, 10.0 * math.exp(x)) for x in d), guarded=True, scored=False
    )
    v = _decide(_fixed(128, 1.0, 0.002), _fixed(512, 1.0, 0.002), prefill)
    by = {e.metric: e for e in v.estimates if e.context == 512}
    e = by["prefill_tps"]
    assert e.regression and e.ci_high * (1 + e.mde) > 1 and e.mde < RULES.tiers[0].lower_bound * 2
    assert v.status is Status.INCONCLUSIVE
    [reason] = v.reasons
    assert (
        "prefill_tps" in reason and "too imprecise to call a regression" in reason and "floor" not in reason
    )


def _fixed(ctx: int, ratio: float, sd: float, n: int = 12) -> ThroughputPairs:
    """n pairs whose log-ratios have exactly this mean and sample sd (alternating +-)."""
    d = [math.log(ratio) + sd * (1 if i % 2 else -1) * math.sqrt((n - 1) / n) for i in range(n)]
    return ThroughputPairs(
        "m", ctx, "decode_tps", tuple((10.0, 10.0 * math.exp(x)) for x in d), guarded=True, scored=True
    )


def _decide(*tps: ThroughputPairs, rules: Rules = RULES):
    prov = Provenance(
        repo="r",
        base_sha="a" * 40,
        head_sha="b" * 40,
        harness_sha="a" * 40,
        rules_hash=rules.rules_hash,
        profile="cpu",
    )
    return decide(Measurements(provenance=prov, throughput=tps), rules)


def test_a_tier_stands_where_its_context_resolves_it_and_the_imprecise_one_is_clearly_not_slower():
    """The fixture's case from CI: ctx 512 read 10x at an MDE of 15%, ctx 128 4x at an MDE of 61%; the 4x
    could only add to the tier, so the verdict is the tier ctx 512 earned, not INCONCLUSIVE."""
    v = _decide(_fixed(128, 4.0, 0.5), _fixed(512, 10.0, 0.04))
    by = {e.context: e for e in v.estimates}
    assert by[128].mde > 0.5 and by[128].ci_low > 1.0 and by[512].mde < RULES.tiers[-1].lower_bound
    assert v.status is Status.PASS and v.tier == RULES.tiers[-1].name and v.scored_context == 512


def test_an_imprecise_context_that_could_hide_a_regression_keeps_a_tier_inconclusive():
    v = _decide(_fixed(128, 1.0, 0.08), _fixed(512, 1.3, 0.01))
    by = {e.context: e for e in v.estimates}
    assert by[128].ci_low < RULES.gates.no_regression.min_ratio < by[128].ci_high
    assert v.status is Status.INCONCLUSIVE and v.tier is None
    assert any("ctx 128" in r for r in v.reasons) and not any("ctx 512" in r for r in v.reasons)


def test_a_tier_from_a_context_too_imprecise_for_it_is_not_awarded():
    """A lower bound that clears S (+3.5%) at an MDE of 8% is the kind of read equal code gives by luck."""
    v = _decide(_fixed(128, 1.12, 0.06, n=6), _fixed(512, 1.12, 0.06, n=6))
    best = max(v.estimates, key=lambda e: e.ci_low)
    assert best.ci_low > 1.035 and best.mde > 0.06
    assert v.status is Status.INCONCLUSIVE and v.tier is None


def test_a_proven_regression_rejects_however_wide_its_interval():
    v = _decide(_fixed(128, 1.0, 0.004), _fixed(512, 0.88, 0.06))
    by = {e.context: e for e in v.estimates}
    assert by[512].ci_high < RULES.gates.no_regression.min_ratio and by[512].mde > 0.05
    assert v.status is Status.REJECT and RULES.labels.regression in v.labels_add


def _blocks(rng: random.Random, n_blocks: int, gain: float, noise: float) -> Measurements:
    """One pair per block, each block its own process offset, the load order alternating: what `--max-pairs
    2` measures (2 blocks, 1 degree of freedom) or 4 (a crossover of 4, 2 degrees)."""
    prov = Provenance(
        repo="r",
        base_sha="a" * 40,
        head_sha="b" * 40,
        harness_sha="a" * 40,
        rules_hash=RULES.rules_hash,
        profile="cpu",
    )
    pairs = tuple((10.0, 10.0 * (1 + gain) * math.exp(rng.gauss(0, noise))) for _ in range(n_blocks))
    tps = tuple(
        ThroughputPairs(
            "m",
            c.ctx,
            "decode_tps",
            pairs,
            guarded=c.guarded,
            scored=c.scored,
            blocks=tuple(range(n_blocks)),
            base_first=tuple(b % 2 == 0 for b in range(n_blocks)),
        )
        for c in CPU.contexts
    )
    return Measurements(
        provenance=prov, throughput=tps, accuracy=(AccuracyResult("m", 128, 0.99, 0.001, 1.0),)
    )


def test_two_blocks_decide_nothing_however_far_they_agree():
    """Equal code in 2 blocks: their means agree by chance often enough (1 degree of freedom: Cauchy tails)
    that about 1 A/A run in 80 read a tier (CI read +11.1% [+7.8%, +14.4%] on equal code). Such a run is
    INCONCLUSIVE and says why; nothing it reads earns a tier or a REJECT."""
    rng = random.Random(40)
    outcomes = Counter()
    for _ in range(3000):
        v = decide(_blocks(rng, 2, 0.0, 0.05), RULES)
        assert v.tier is None and v.status is not Status.REJECT, v.reasons
        outcomes[v.status] += 1
    assert outcomes == {Status.INCONCLUSIVE: 3000}
    assert "1 degree of freedom" in v.reasons[0] and "needs 2" in v.reasons[0]
    # the same two blocks reading a 3x speedup or a halving decide nothing either
    for gain in (2.0, -0.5):
        v = decide(_blocks(random.Random(1), 2, gain, 0.001), RULES)
        assert v.status is Status.INCONCLUSIVE and v.tier is None, v.reasons


def test_a_crossover_of_four_blocks_still_decides():
    rng = random.Random(41)
    assert decide(_blocks(rng, 4, 0.10, 0.002), RULES).tier is not None
    assert decide(_blocks(rng, 4, -0.5, 0.002), RULES).status is Status.REJECT
