"""evalbot.stats: t quantiles, paired estimate, coverage and power in simulation (stopping on precision too), tiers, parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evalbot.stats import (
    PairedEstimate,
    StatsError,
    _t_upper_tail,
    classify,
    estimate,
    minimum_detectable_effect,
    read_pairs,
    t_quantile,
)

TIERS = [("M", 0.10), ("XS", 0.02), ("S", 0.05)]  # deliberately unsorted: classify must not care
NOISE = 0.01  # "1% noise": log-normal sigma of each single measurement, base and head alike

# --- t quantile --------------------------------------------------------------------------------

T_PROBS = (0.9, 0.95, 0.975, 0.99, 0.995)
# Independent reference: mpmath's regularized incomplete beta at 40 digits, inverted by bisection.
T_TABLE = {
    1: (3.07768354, 6.31375151, 12.70620474, 31.82051595, 63.65674116),
    2: (1.88561808, 2.91998558, 4.30265273, 6.96455673, 9.92484320),
    3: (1.63774435, 2.35336343, 3.18244631, 4.54070286, 5.84090931),
    4: (1.53320627, 2.13184679, 2.77644511, 3.74694739, 4.60409487),
    5: (1.47588405, 2.01504837, 2.57058184, 3.36493000, 4.03214298),
    6: (1.43975575, 1.94318028, 2.44691185, 3.14266840, 3.70742802),
    7: (1.41492393, 1.89457861, 2.36462425, 2.99795157, 3.49948330),
    8: (1.39681531, 1.85954804, 2.30600414, 2.89645945, 3.35538733),
    9: (1.38302874, 1.83311293, 2.26215716, 2.82143793, 3.24983554),
    10: (1.37218364, 1.81246112, 2.22813885, 2.76376946, 3.16927267),
    11: (1.36343032, 1.79588482, 2.20098516, 2.71807918, 3.10580652),
    12: (1.35621733, 1.78228756, 2.17881283, 2.68099799, 3.05453959),
    13: (1.35017129, 1.77093340, 2.16036866, 2.65030884, 3.01227584),
    14: (1.34503037, 1.76131014, 2.14478669, 2.62449407, 2.97684273),
    15: (1.34060561, 1.75305036, 2.13144955, 2.60248030, 2.94671288),
    16: (1.33675717, 1.74588368, 2.11990530, 2.58348719, 2.92078162),
    17: (1.33337939, 1.73960673, 2.10981558, 2.56693398, 2.89823052),
    18: (1.33039094, 1.73406361, 2.10092204, 2.55237963, 2.87844047),
    19: (1.32772821, 1.72913281, 2.09302405, 2.53948319, 2.86093461),
    20: (1.32534071, 1.72471824, 2.08596345, 2.52797700, 2.84533971),
    21: (1.32318787, 1.72074290, 2.07961384, 2.51764802, 2.83135956),
    22: (1.32123674, 1.71714437, 2.07387307, 2.50832455, 2.81875606),
    23: (1.31946024, 1.71387153, 2.06865761, 2.49986674, 2.80733568),
    24: (1.31783593, 1.71088208, 2.06389856, 2.49215947, 2.79693950),
    25: (1.31634507, 1.70814076, 2.05953855, 2.48510718, 2.78743581),
    26: (1.31497186, 1.70561792, 2.05552944, 2.47862982, 2.77871453),
    27: (1.31370291, 1.70328845, 2.05183052, 2.47265991, 2.77068296),
    28: (1.31252678, 1.70113093, 2.04840714, 2.46714010, 2.76326246),
    29: (1.31143365, 1.69912703, 2.04522964, 2.46202136, 2.75638590),
    30: (1.31041503, 1.69726089, 2.04227246, 2.45726154, 2.74999565),
    60: (1.29582109, 1.67064886, 2.00029782, 2.39011947, 2.66028303),
    120: (1.28864623, 1.65765090, 1.97993041, 2.35782461, 2.61742115),
    math.inf: (1.28155157, 1.64485363, 1.95996398, 2.32634787, 2.57582930),
}


@pytest.mark.parametrize("df", list(T_TABLE))
def test_t_quantile_matches_table(df):
    for p, expected in zip(T_PROBS, T_TABLE[df], strict=True):
        assert t_quantile(p, df) == pytest.approx(expected, abs=1e-7)
        assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-7)


@pytest.mark.parametrize("p", [1e-9, 0.01, 0.3, 0.5, 0.77, 0.999, 1 - 1e-9])
def test_t_quantile_closed_forms_and_cdf_round_trip(p):
    # Cauchy: -cot(pi p); written per side so the reference itself keeps its digits near p = 0, 1.
    cauchy = -1 / math.tan(math.pi * p) if p < 0.5 else 1 / math.tan(math.pi * (1 - p))
    assert t_quantile(p, 1) == pytest.approx(cauchy, rel=1e-9, abs=1e-12)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9, abs=1e-12)
    for df in (0.5, 1, 3, 7.5, 29, 500, 2999, 3001, 1e6, math.inf):
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, rel=1e-9, abs=1e-15)


def t_cdf(t, df):
    """P(T <= t), from the upper tail the estimator's p-values are read from."""
    tail = _t_upper_tail(abs(t), df)
    return 1.0 - tail if t > 0 else tail


def test_t_quantile_rejects_bad_arguments():
    for p in (0.0, 1.0, -0.1, 1.5, math.nan):
        with pytest.raises(StatsError, match="probability"):
            t_quantile(p, 5)
    for df in (0, -1, math.nan):
        with pytest.raises(StatsError, match="degrees of freedom"):
            t_quantile(0.9, df)


# --- Estimate: exact values and errors ---------------------------------------------------------


def test_estimate_two_pairs_by_hand():
    est = estimate([(100.0, 102.0), (100.0, 104.0)])
    d = [math.log(1.02), math.log(1.04)]
    mean, sd = sum(d) / 2, abs(d[1] - d[0]) / math.sqrt(2)
    hw = 12.70620474 * sd / math.sqrt(2)
    assert est.n == 2
    assert est.ratio == pytest.approx(math.sqrt(1.02 * 1.04), rel=1e-12)
    assert est.sd_log == pytest.approx(sd, rel=1e-12)
    assert est.half_width == pytest.approx(hw, rel=1e-8)
    assert (est.ci_low, est.ci_high) == pytest.approx((math.exp(mean - hw), math.exp(mean + hw)), rel=1e-8)
    assert est.gain == pytest.approx(est.ratio - 1)
    assert est.lower_bound_gain == pytest.approx(est.ci_low - 1)
    assert est.upper_bound_ratio == est.ci_high
    # one-sided p of t = mean / (sd / sqrt 2) with 1 df (Cauchy): 1/2 - atan(t) / pi
    assert est.p_value == pytest.approx(0.5 - math.atan(mean / (sd / math.sqrt(2))) / math.pi, rel=1e-9)
    assert est.confidence == 0.95


def test_mde_formula_and_identical_ratios():
    est = estimate([(100.0, 101.0), (100.0, 103.0), (100.0, 102.0), (100.0, 102.5)])
    shift = (t_quantile(0.975, 3) + t_quantile(0.8, 3)) * est.sd_log / 2
    assert est.mde == pytest.approx(math.expm1(shift), rel=1e-12)
    flat = estimate([(100.0, 105.0), (200.0, 210.0), (50.0, 52.5)])
    assert flat.sd_log == 0 and flat.mde == 0 and flat.p_value == 0
    assert flat.ci_low == flat.ratio == flat.ci_high == pytest.approx(1.05)
    assert estimate([(3.0, 3.0), (7.0, 7.0)]).p_value == 0.5


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([], "at least 2 pairs"),
        ([(1.0, 2.0)], "at least 2 pairs"),
        ([(1.0, 2.0), (math.nan, 2.0)], "pair 2 base .*finite"),
        ([(1.0, 2.0), (1.0, math.inf)], "pair 2 head .*finite"),
        ([(0.0, 2.0), (1.0, 2.0)], "pair 1 base .*positive"),
        ([(1.0, -2.0), (1.0, 2.0)], "pair 1 head .*positive"),
        ([(1.0, "fast"), (1.0, 2.0)], "pair 1 head .*not a number"),
        ([(1.0, 2.0, 3.0), (1.0, 2.0)], "pair 1 .*not a \\(base, head\\) pair"),
    ],
)
def test_estimate_rejects_bad_input(pairs, message):
    with pytest.raises(StatsError, match=message):
        estimate(pairs)
    assert issubclass(StatsError, ValueError)


@pytest.mark.parametrize("confidence", [0.0, 1.0, 95])
def test_estimate_rejects_bad_confidence(confidence):
    with pytest.raises(StatsError, match="confidence"):
        estimate([(1.0, 2.0), (1.0, 2.1)], confidence=confidence)


# --- Properties ----------------------------------------------------------------------------------

throughput = st.floats(min_value=0.1, max_value=1e4, allow_nan=False, allow_infinity=False)  # within 1e6x
pair_lists = st.lists(st.tuples(throughput, throughput), min_size=2, max_size=40)


@settings(max_examples=200, deadline=None)
@given(pair_lists)
def test_swapping_base_and_head_inverts_the_ratio(pairs):
    est = estimate(pairs)
    swapped = estimate([(h, b) for b, h in pairs])
    assert swapped.ratio == pytest.approx(1 / est.ratio, rel=1e-12)
    assert swapped.ci_low == pytest.approx(1 / est.ci_high, rel=1e-12)
    assert swapped.ci_high == pytest.approx(1 / est.ci_low, rel=1e-12)
    assert swapped.half_width == est.half_width and swapped.mde == est.mde
    assert swapped.p_value == pytest.approx(1 - est.p_value, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(pair_lists, st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_every_value_changes_nothing(pairs, c):
    est = estimate(pairs)
    scaled = estimate([(c * b, c * h) for b, h in pairs])
    for field in ("ratio", "ci_low", "ci_high"):
        assert getattr(scaled, field) == pytest.approx(getattr(est, field), rel=1e-9)
    for field in ("half_width", "sd_log", "mde"):
        assert getattr(scaled, field) == pytest.approx(getattr(est, field), rel=1e-6, abs=1e-11)
    if est.sd_log > 1e-6:  # below that the t statistic is float rounding, not data
        assert scaled.p_value == pytest.approx(est.p_value, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(pair_lists, st.randoms(use_true_random=False))
def test_interval_holds_the_point_and_order_does_not_matter(pairs, rnd):
    est = estimate(pairs)
    assert est.ci_low <= est.ratio <= est.ci_high
    assert est.half_width >= 0 and est.mde >= 0 and 0 <= est.p_value <= 1
    shuffled = list(pairs)
    rnd.shuffle(shuffled)
    assert estimate(shuffled) == est  # exact: the sums are math.fsum


# --- Simulation: base_i = drift_i * eps_b, head_i = drift_i * r * eps_h --------------------------


def simulate(rng, trials, n, ratio, noise=NOISE):
    """(base, head) arrays [trials, n] with log-normal noise and a slow drift shared within each pair."""
    i = np.arange(n)
    # +-15% slow swing plus a 0.5%/pair trend: far larger than the effects, so it must cancel.
    drift = 100.0 * np.exp(0.15 * np.sin(2 * np.pi * i / 17 + rng.uniform(0, 6.3, (trials, 1))) + 0.005 * i)
    base = drift * np.exp(rng.normal(0, noise, (trials, n)))
    head = drift * ratio * np.exp(rng.normal(0, noise, (trials, n)))
    return base, head


def test_drift_cancels():
    base, head = simulate(np.random.default_rng(0), 1, 20, 1.03)
    flat = np.full(20, 100.0)
    with_drift = estimate(list(zip(base[0], head[0], strict=True)))
    without = estimate(list(zip(flat, flat * head[0] / base[0], strict=True)))
    assert with_drift.ratio == pytest.approx(without.ratio, rel=1e-12)
    assert with_drift.half_width == pytest.approx(without.half_width, rel=1e-9)


@pytest.mark.parametrize("n", [10, 30])
def test_ci_coverage_is_95_percent(n):
    rng = np.random.default_rng(n)
    true_ratio = 1.03
    base, head = simulate(rng, 2000, n, true_ratio)
    covered = [
        (est := estimate(list(zip(b.tolist(), h.tolist(), strict=True)))).ci_low <= true_ratio <= est.ci_high
        for b, h in zip(base, head, strict=True)
    ]
    coverage = float(np.mean(covered))
    print(f"\nCI coverage at n={n}: {coverage:.4f} (nominal 0.95, 2000 experiments)")
    assert 0.93 <= coverage <= 0.97


def sample_until_precise(measure_pair, *, target_half_width=0.005, min_pairs=5, max_pairs=30):
    """Pairs from measure_pair(), one at a time, until the CI's half-width (log units) reaches the target
    (from min_pairs on) or max_pairs are in: stopping on precision, as the A/B runner does."""
    pairs = []
    while len(pairs) < max_pairs:
        if len(pairs) >= min_pairs and estimate(pairs).half_width <= target_half_width:
            break
        pairs.append(measure_pair())
    return pairs


def adaptive_trials(seed, true_ratio, trials=2000, noise=NOISE, max_pairs=30):
    """The estimates of `trials` simulated experiments, each stopped on precision."""
    base, head = simulate(np.random.default_rng(seed), trials, max_pairs, true_ratio, noise)
    runs = []
    for b, h in zip(base, head, strict=True):
        stream = zip(b.tolist(), h.tolist(), strict=True)
        runs.append(estimate(sample_until_precise(lambda s=stream: next(s), max_pairs=max_pairs)))
    return runs


def test_aa_false_gain_rate_with_adaptive_stopping():
    runs = adaptive_trials(seed=11, true_ratio=1.0)
    tiers = [classify(r, TIERS, tolerance=0.98).tier for r in runs]
    false_xs = np.mean([t is not None for t in tiers])
    any_gain = np.mean([r.ci_low > 1 for r in runs])
    regressions = np.mean([classify(r, TIERS, tolerance=0.98).regression for r in runs])
    mean_n = np.mean([r.n for r in runs])
    print(
        f"\nA/A at {NOISE:.0%} noise, adaptive (mean n {mean_n:.1f}): false >=XS rate {false_xs:.4f}, "
        f"CI above 1 {any_gain:.4f}, false regression {regressions:.4f}"
    )
    assert false_xs <= 0.01
    assert regressions <= 0.01


def test_true_5_percent_gain_is_detected():
    runs = adaptive_trials(seed=12, true_ratio=1.05)
    detected = np.mean([classify(r, TIERS, tolerance=0.98).tier is not None for r in runs])
    precise = sum(r.half_width <= 0.005 for r in runs)
    print(
        f"\nTrue +5% at {NOISE:.0%} noise, adaptive: detected as >=XS in {detected:.4f} ({precise} precise)"
    )
    assert detected >= 0.95


@pytest.mark.parametrize("noise", [0.003, 0.005, NOISE])
def test_coverage_survives_adaptive_stopping(noise):
    runs = adaptive_trials(seed=13, true_ratio=1.02, noise=noise)
    coverage = np.mean([r.ci_low <= 1.02 <= r.ci_high for r in runs])
    mean_n = np.mean([r.n for r in runs])
    # Stopping on a small observed spread costs a little coverage; min_pairs keeps it near nominal.
    print(f"\nCI coverage under adaptive stopping at {noise:.1%} noise: {coverage:.4f} (mean n {mean_n:.1f})")
    assert coverage >= 0.92


def test_mde_has_80_percent_power():
    n, sd_log = 10, NOISE * math.sqrt(2)
    effect = math.log1p(minimum_detectable_effect(sd_log / math.sqrt(n), n - 1))
    rng = np.random.default_rng(5)
    d = rng.normal(effect, sd_log, (20000, n))
    lower = d.mean(1) - t_quantile(0.975, n - 1) * d.std(1, ddof=1) / math.sqrt(n)
    power = float(np.mean(lower > 0))
    print(f"\nPower at the MDE (n={n}, known sd): {power:.4f} (target 0.80)")
    assert 0.76 <= power <= 0.84


# --- Tiers and regressions ---------------------------------------------------------------------


def interval(ci_low, ci_high):
    ratio = math.sqrt(ci_low * ci_high)
    return PairedEstimate(
        n=10,
        ratio=ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        half_width=math.log(ci_high / ratio),
        sd_log=0.01,
        mde=0.01,
        p_value=0.5,
        confidence=0.95,
        df=9,
    )


@pytest.mark.parametrize(
    ("ci_low", "ci_high", "tier", "regression"),
    [
        (1.02, 1.03, "XS", False),  # lower bound exactly on the boundary earns it
        (1.0199, 1.06, None, False),
        (1.049, 1.11, "XS", False),  # point near 8% but the CI straddles S: the lower tier
        (1.05, 1.06, "S", False),
        (1.30, 1.40, "M", False),
        (0.99, 1.01, None, False),
        (0.95, 0.979, None, True),
        (0.95, 0.98, None, False),  # upper bound exactly at the tolerance is not a regression
        (0.95, 0.99, None, False),  # point 3% slower, but the CI reaches back above the tolerance
    ],
)
def test_classify_boundaries(ci_low, ci_high, tier, regression):
    assert classify(interval(ci_low, ci_high), TIERS, tolerance=0.98) == (
        classify(interval(ci_low, ci_high), list(reversed(TIERS)), tolerance=0.98)
    )
    got = classify(interval(ci_low, ci_high), TIERS, tolerance=0.98)
    assert (got.tier, got.regression) == (tier, regression)


def test_classify_rejects_bad_tiers():
    est = interval(1.0, 1.1)
    assert classify(est, [], tolerance=0.98).tier is None
    with pytest.raises(StatsError, match="unique"):
        classify(est, [("XS", 0.02), ("XS", 0.05)], tolerance=0.98)
    with pytest.raises(StatsError, match="min_gain"):
        classify(est, [("XS", -0.02)], tolerance=0.98)
    with pytest.raises(StatsError, match="min_gain"):
        classify(est, [("XS", math.nan)], tolerance=0.98)
    with pytest.raises(StatsError, match="tolerance"):
        classify(est, TIERS, tolerance=0.0)


# --- Parsing -----------------------------------------------------------------------------------


def test_read_pairs_accepts_csv_tsv_any_order_and_extra_columns():
    assert read_pairs("base,head\n100,101\n99.5,100.25\n") == [(100.0, 101.0), (99.5, 100.25)]
    assert read_pairs("head\tbase\n101\t100\n") == [(100.0, 101.0)]
    text = '# bench run 7\r\nPair, Head , note,BASE\r\n\r\n1, 2.5e2 ,"warm, ok",250\r\n2,260,,255\r\n'
    assert read_pairs(text) == [(250.0, 250.0), (255.0, 260.0)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no header"),
        ("\n# only a comment\n", "no header"),
        ("base,tail\n1,2\n", "line 1: column 'head' is missing"),
        ("base,head,base\n1,2,3\n", "line 1: column 'base' is repeated"),
        ("base,head\n\n", "no data rows after the header on line 1"),
        ("base,head\n1,2\n3\n", "line 3: 1 fields, but the header has 2"),
        ("base,head\n1,2\n\n1,2,3\n", "line 4: 3 fields"),
        ("base,head\n1,2\nfast,2\n", "line 3: base is 'fast', not a number"),
        ("base,head\n1,\n", "line 2: head is '', not a number"),
        ("base\thead\n1\tnan\n", "line 2: head is nan; throughput must be finite"),
        ("base,head\n1,2\n-1,2\n", "line 3: base is -1.0; throughput must be positive"),
        ("base,head\n0,2\n", "line 2: base is 0.0; throughput must be positive"),
        ("base,head\ninf,2\n", "line 2: base is inf"),
    ],
)
def test_read_pairs_rejects_garbage_with_line_numbers(text, message):
    with pytest.raises(StatsError) as err:
        read_pairs(text)
    assert message in str(err.value)
