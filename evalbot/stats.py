"""Paired A/B statistics for throughput: ratio estimate, confidence interval, tiers.

The input is interleaved pairs ``(base_i, head_i)`` of a higher-is-better metric (tok/s) measured
back to back on the same box. The estimate is the geometric mean of the per-pair ratios
``head_i / base_i`` with a Student-t interval on the log-ratios ``d_i = ln head_i - ln base_i``.

Why this estimator:

- *Paired log-ratios cancel drift.* Thermal state, clocks and background load move throughput
  multiplicatively and slowly; inside one pair both sides see the same factor, so it drops out
  of ``d_i`` and only the pair-to-pair noise is left. Drift *within* a pair does not cancel, so
  the runner should alternate which side goes first (AB, BA, AB, ...).
- *Logs make the effect additive and symmetric.* Swapping base and head negates every ``d_i``, so
  the estimate becomes exactly ``1 / ratio``; an arithmetic mean of ratios would not.
- *t-interval rather than bootstrap.* Under log-normal noise the t-interval on ``d_i`` is exact
  at every n, and by the CLT it stays well calibrated from n of about 5 for other noise shapes.
  A percentile bootstrap resamples only the n values seen, so it underestimates the spread and
  undercovers at the small n we can afford (simulated nominal-95% coverage: 84% at n=5, 89% at
  n=10, 92% at n=30).

Relative half-width is defined in log space: ``half_width = t * sd / sqrt(n)``, so the interval is
``ratio * exp(+-half_width)``; 0.005 means about +-0.5%.

The minimum detectable effect (MDE) is the smallest true gain that the same decision rule
(CI lower bound above 1, i.e. a one-sided test at ``alpha = (1 - confidence) / 2``) would detect
with 80% power, at the observed spread: ``mde = exp((t[1-alpha, n-1] + t[power, n-1]) * sd / sqrt(n)) - 1``
(the usual shifted-central-t approximation of the noncentral t power).
"""

from __future__ import annotations

import csv
import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# ln(head) - ln(base) carries ~1e-13 absolute rounding error even for huge values; spreads below
# this are rounding, not noise, and would otherwise turn exact ties into arbitrary p-values.
_LOG_RESOLUTION = 1e-12
# A pair whose head/base ratio is beyond 1e6 either way is garbage, not a speedup (and exp() of such
# log-ratios overflows).
_MAX_LOG_RATIO = math.log(1e6)
# Power of the minimum-detectable-effect report; 80% is the conventional choice.
MDE_POWER = 0.8
# Above this many degrees of freedom the Cornish-Fisher series is good to ~1e-14, while
# lgamma(df / 2) in the incomplete beta starts to lose digits (~1e-11 by df = 1e4).
_ASYMPTOTIC_DF = 3000.0


class StatsError(ValueError):
    """Input that cannot give a meaningful estimate (too few pairs, non-positive or non-finite values)."""


@dataclass(frozen=True)
class PairedEstimate:
    """Geometric-mean ratio head/base of n pairs with its confidence interval and noise summary."""

    n: int
    ratio: float  # geometric mean of head_i / base_i
    ci_low: float  # ratio bounds of the two-sided `confidence` interval
    ci_high: float
    half_width: float  # t * sd_log / sqrt(n), in natural-log units (0.005 ~ +-0.5%)
    sd_log: float  # sample standard deviation of the log-ratios
    mde: float  # minimum detectable gain at 80% power, as a fraction (0.01 = 1%)
    p_value: float  # one-sided, for "head is faster than base"
    confidence: float  # the interval's coverage, e.g. 0.95
    df: int  # the interval's degrees of freedom (pairs - 1, blocks - 1, or blocks - 2 in a crossover)

    @property
    def gain(self) -> float:
        """Point estimate of the relative speedup (0.05 = 5% faster)."""
        return self.ratio - 1.0

    @property
    def lower_bound_gain(self) -> float:
        """The smallest gain the interval allows; tiers are assigned from this."""
        return self.ci_low - 1.0

    @property
    def upper_bound_ratio(self) -> float:
        """The largest ratio the interval allows; a regression needs this below the tolerance."""
        return self.ci_high


@dataclass(frozen=True)
class Classification:
    """Tier earned by the CI's lower bound (None below every tier) and whether it is a regression."""

    tier: str | None
    regression: bool


# --- Student t ---------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz), valid for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 20_000):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """Regularized incomplete beta I_x(a, b); y = 1 - x is passed in so it keeps full precision."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, y) / b


def _t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0, computed directly so tiny tails keep their relative precision."""
    if math.isinf(df):
        return statistics.NormalDist().cdf(-t)
    if df > _ASYMPTOTIC_DF:
        # lgamma(df/2) loses digits here; invert the Cornish-Fisher series (nearly the identity) instead.
        z = t
        for _ in range(50):
            step = (_cornish_fisher(z, df) - t) / (1.0 + (3.0 * z * z + 1.0) / (4.0 * df))
            z -= step
            if abs(step) <= 1e-15 * max(1.0, abs(z)):
                break
        return statistics.NormalDist().cdf(-z)
    t2 = t * t
    if math.isinf(t2):
        return 0.0
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def _t_pdf(t: float, df: float) -> float:
    log_norm = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1.0) / 2.0 * math.log1p(t * t / df))


def _cornish_fisher(z: float, df: float) -> float:
    """t quantile from the normal quantile z (Abramowitz & Stegun 26.7.5); exact as df grows."""
    z2 = z * z
    g1 = (z2 + 1.0) * z / 4.0
    g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0
    g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0
    g4 = ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) * z / 92160.0
    return z + (g1 + (g2 + (g3 + g4 / df) / df) / df) / df


def _check_df(df: float) -> None:
    if not df > 0:
        raise StatsError(f"degrees of freedom must be positive, got {df!r}")


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p for Student's t with df degrees of freedom (df may be math.inf)."""
    _check_df(df)
    if not 0.0 < p < 1.0:
        raise StatsError(f"probability must be strictly between 0 and 1, got {p!r}")
    # Solve for the tail probability q <= 1/2 directly: forming 1 - p for a tiny p would lose digits.
    sign, q = (-1.0, p) if p < 0.5 else (1.0, 1.0 - p)
    if q == 0.5:
        return 0.0
    z = -statistics.NormalDist().inv_cdf(q)
    if math.isinf(df) or df > _ASYMPTOTIC_DF:
        return sign * (z if math.isinf(df) else _cornish_fisher(z, df))
    return sign * _t_upper_quantile(q, z, df)


def _t_upper_quantile(q: float, z: float, df: float) -> float:
    """The t > 0 with P(T > t) = q, starting from the normal quantile z."""
    # Safeguarded Newton: the bracket [lo, hi] always holds the root, and any Newton step that
    # leaves it (heavy tails at small df overshoot) is replaced by bisection.
    guess = _cornish_fisher(z, df)
    lo, hi = 0.0, max(1.0, guess)
    while _t_upper_tail(hi, df) > q:
        lo, hi = hi, 2.0 * hi
    t = guess if lo < guess < hi else 0.5 * (lo + hi)
    for _ in range(200):
        excess = _t_upper_tail(t, df) - q
        if excess == 0.0:
            return t
        if excess > 0.0:
            lo = t
        else:
            hi = t
        nxt = t + excess / _t_pdf(t, df)
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - t) <= 1e-14 * max(1.0, t):
            return nxt
        t = nxt
    return t


# --- Estimate ----------------------------------------------------------------------------------


def _checked_value(value: object, what: str) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise StatsError(f"{what} is {value!r}, not a number") from None
    if not math.isfinite(x):
        raise StatsError(f"{what} is {x!r}; throughput must be finite")
    if x <= 0.0:
        raise StatsError(f"{what} is {x!r}; throughput must be positive")
    return x


def _log_ratios(pairs: Sequence[tuple[float, float]]) -> list[float]:
    out = []
    for i, pair in enumerate(pairs, 1):
        try:
            base, head = pair
        except (TypeError, ValueError):
            raise StatsError(f"pair {i} is {pair!r}, not a (base, head) pair") from None
        # log(h) - log(b), not log(h / b): swapping the pair then negates it exactly.
        d = math.log(_checked_value(head, f"pair {i} head")) - math.log(
            _checked_value(base, f"pair {i} base")
        )
        if abs(d) > _MAX_LOG_RATIO:
            raise StatsError(
                f"pair {i}: head/base is {math.exp(min(d, 700)):.3g}, beyond the 1e6x either way "
                "a throughput comparison can mean"
            )
        out.append(d)
    return out


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    # fsum is exactly rounded, so the result does not depend on the order of the pairs.
    mean = math.fsum(xs) / len(xs)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return mean, (sd if sd > _LOG_RESOLUTION else 0.0)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise StatsError(f"confidence must be strictly between 0 and 1, got {confidence!r}")


def minimum_detectable_effect(se: float, df: float, alpha: float = 0.025, power: float = MDE_POWER) -> float:
    """Smallest true gain a one-sided level-alpha t-test (df degrees of freedom) on a mean log-ratio of
    standard error se detects with `power`."""
    return math.expm1((t_quantile(1.0 - alpha, df) + t_quantile(power, df)) * se)


def _t_estimate(units: Sequence[float], n_pairs: int, confidence: float) -> PairedEstimate:
    """The ratio estimate from independent log-ratio units (pairs, or blocks' mean log-ratios): a
    t-interval with len(units) - 1 degrees of freedom, its p-value and MDE on the same units."""
    k = len(units)
    mean, sd = _mean_sd(units)
    return _from_se(mean, sd / math.sqrt(k), k - 1, sd, n_pairs, confidence)


def estimate(pairs: Sequence[tuple[float, float]], confidence: float = 0.95) -> PairedEstimate:
    """Geometric-mean ratio head/base with a t-interval on the paired log-ratios (see module docstring)."""
    _check_confidence(confidence)
    if len(pairs) < 2:
        raise StatsError(f"need at least 2 pairs to estimate the noise, got {len(pairs)}")
    return _t_estimate(_log_ratios(pairs), len(pairs), confidence)


def estimate_blocked(
    pairs: Sequence[tuple[float, float]], blocks: Sequence[int], confidence: float = 0.95
) -> PairedEstimate:
    """The paired estimate with process blocks as clusters: pairs measured in the same pair of serving
    processes share those processes' offsets, so the interval is a t-interval over the blocks' mean
    log-ratios (J blocks, J - 1 degrees of freedom), and so is the MDE. With one block (or no blocks
    given) it is `estimate` over the pairs."""
    if len(blocks) != len(pairs):
        raise StatsError(f"{len(pairs)} pairs but {len(blocks)} block labels")
    groups: dict[int, list[float]] = {}
    for b, d in zip(blocks, _log_ratios(pairs), strict=True):
        groups.setdefault(b, []).append(d)
    if len(groups) < 2:
        return estimate(pairs, confidence)
    _check_confidence(confidence)
    means = [math.fsum(v) / len(v) for _, v in sorted(groups.items())]
    return _t_estimate(means, len(pairs), confidence)


def estimate_clustered(
    pairs: Sequence[tuple[float, float]], clusters: Sequence[int], confidence: float = 0.95
) -> PairedEstimate:
    """The paired estimate of units that are independent draws (each its own prompt) but measured in
    clusters that may share an offset (the speculative runs, spread over the A/B's blocks: each block a
    pair of processes). The mean log-ratio over all units, its standard error widened by Kish's design
    effect 1 + (m - 1) * rho, rho the clusters' intraclass correlation (one-way ANOVA, 0 at the least) and m
    the units' size-weighted cluster size; degrees of freedom the clusters' less one where rho > 0, else the
    units' less one. Where the clusters explain nothing, it is `estimate`; where they explain some, about
    the t-interval over the cluster means (whose variance the widened one then estimates)."""
    if len(clusters) != len(pairs):
        raise StatsError(f"{len(pairs)} pairs but {len(clusters)} cluster labels")
    _check_confidence(confidence)
    d = _log_ratios(pairs)
    groups: dict[int, list[float]] = {}
    for c, x in zip(clusters, d, strict=True):
        groups.setdefault(c, []).append(x)
    n, k = len(d), len(groups)
    if n < 2:
        raise StatsError(f"need at least 2 pairs to estimate the noise, got {n}")
    if k < 2 or k == n:
        return estimate(pairs, confidence)
    mean, sd = _mean_sd(d)
    sizes = [len(v) for v in groups.values()]
    msb = math.fsum(len(v) * (math.fsum(v) / len(v) - mean) ** 2 for v in groups.values()) / (k - 1)
    msw = math.fsum((x - math.fsum(v) / len(v)) ** 2 for v in groups.values() for x in v) / (n - k)
    m0 = (n - math.fsum(m * m for m in sizes) / n) / (k - 1)
    between = max(msb - msw, 0.0) / m0
    rho = between / (between + msw) if between + msw > 0 else 0.0
    deff = 1.0 + (math.fsum(m * m for m in sizes) / n - 1.0) * rho
    # where the blocks explain some of the spread, the interval has the blocks' degrees of freedom (the
    # variance of the mean is then about the block means' own); where they explain none, the runs'
    df = k - 1 if rho > 0 else n - 1
    return _from_se(mean, sd * math.sqrt(deff / n), df, sd, n, confidence)


def _from_se(mean: float, se: float, df: int, sd: float, n_pairs: int, confidence: float) -> PairedEstimate:
    """A PairedEstimate from a log-ratio estimate, its standard error and degrees of freedom."""
    hw = t_quantile(0.5 + confidence / 2.0, df) * se
    if se <= _LOG_RESOLUTION:
        p_value = 0.5 if abs(mean) <= _LOG_RESOLUTION else (0.0 if mean > 0 else 1.0)
        se = 0.0
    else:
        t_stat = mean / se
        p_value = _t_upper_tail(t_stat, df) if t_stat >= 0 else 1.0 - _t_upper_tail(-t_stat, df)
    return PairedEstimate(
        n=n_pairs,
        ratio=math.exp(mean),
        ci_low=math.exp(mean - hw),
        ci_high=math.exp(mean + hw),
        half_width=hw,
        sd_log=sd,
        # Same test as the tier rule (lower bound above 1), so "detectable" means what the verdict does.
        mde=minimum_detectable_effect(se, df, alpha=(1.0 - confidence) / 2.0),
        p_value=p_value,
        confidence=confidence,
        df=df,
    )


def crossover(
    pairs: Sequence[tuple[float, float]],
    blocks: Sequence[int],
    base_first: Sequence[bool],
    confidence: float = 0.95,
) -> PairedEstimate:
    """The paired estimate of a crossover design: each process block loads one side first, and the blocks
    alternate. A block's mean log-ratio is theta + gamma * s_b + noise (s_b = +1 when the base loaded first,
    -1 otherwise); theta is the mean of the two order groups' means, so a fixed load-order effect gamma
    (measured on a 2-core VM: the second-loaded process decodes about 1% faster) cancels instead of
    biasing the ratio, and leaves the residual variance instead of inflating it. The interval is a t-interval
    with J - 2 degrees of freedom on the pooled within-group spread of the block means."""
    if not len(blocks) == len(pairs) == len(base_first):
        raise StatsError(f"{len(pairs)} pairs, {len(blocks)} block labels and {len(base_first)} load orders")
    _check_confidence(confidence)
    groups: dict[int, list[float]] = {}
    order_of: dict[int, bool] = {}
    for b, loaded_first, d in zip(blocks, base_first, _log_ratios(pairs), strict=True):
        if order_of.setdefault(b, bool(loaded_first)) != bool(loaded_first):
            raise StatsError(f"block {b} has pairs with both load orders")
        groups.setdefault(b, []).append(d)
    means = {b: math.fsum(v) / len(v) for b, v in groups.items()}
    first = [m for b, m in means.items() if order_of[b]]
    second = [m for b, m in means.items() if not order_of[b]]
    if len(first) < 2 or len(second) < 2:
        raise StatsError(
            f"a crossover needs at least 2 blocks of each load order, got {len(first)} and {len(second)}"
        )
    m1, m0 = math.fsum(first) / len(first), math.fsum(second) / len(second)
    df = len(first) + len(second) - 2
    ss = math.fsum((x - m1) ** 2 for x in first) + math.fsum((x - m0) ** 2 for x in second)
    sd = math.sqrt(ss / df)
    sd = sd if sd > _LOG_RESOLUTION else 0.0
    se = 0.5 * sd * math.sqrt(1.0 / len(first) + 1.0 / len(second))
    return _from_se((m1 + m0) / 2.0, se, df, sd, len(pairs), confidence)


def estimate_design(
    pairs: Sequence[tuple[float, float]],
    blocks: Sequence[int] = (),
    base_first: Sequence[bool] = (),
    confidence: float = 0.95,
) -> PairedEstimate:
    """The estimate the measurement's design calls for: a crossover where blocks alternate the load order
    (at least 2 of each), blocks as clusters where they do not, plain pairs without blocks."""
    if base_first and blocks:
        orders = {b: bool(f) for b, f in zip(blocks, base_first, strict=True)}
        if sum(orders.values()) >= 2 and sum(not f for f in orders.values()) >= 2:
            return crossover(pairs, blocks, base_first, confidence)
    if blocks:
        return estimate_blocked(pairs, blocks, confidence)
    return estimate(pairs, confidence)


def decided(est: PairedEstimate, boundaries: Sequence[float], mde_max: float) -> bool:
    """Whether more pairs could no longer change what this estimate decides: its MDE resolves the smallest
    tier and no decision boundary (tier floors and the regression bar, as ratios) lies inside its CI."""
    return est.mde <= mde_max and not any(est.ci_low < b < est.ci_high for b in boundaries)


# --- Tiers and regressions ---------------------------------------------------------------------


def classify(est: PairedEstimate, tiers: Sequence[tuple[str, float]], tolerance: float) -> Classification:
    """Tier: the highest (name, min_gain) with min_gain <= the CI's lower-bound gain.
    Regression: the CI's upper-bound ratio is below tolerance (e.g. 0.98)."""
    names = [name for name, _ in tiers]
    if len(set(names)) != len(names):
        raise StatsError(f"tier names must be unique, got {names}")
    for name, min_gain in tiers:
        if not (math.isfinite(min_gain) and min_gain >= 0):
            raise StatsError(f"tier {name!r} has min_gain {min_gain!r}; it must be finite and >= 0")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise StatsError(f"tolerance must be a positive ratio such as 0.98, got {tolerance!r}")
    # Using the lower bound means a CI straddling a boundary earns the lower tier.
    earned = [(min_gain, name) for name, min_gain in tiers if est.lower_bound_gain >= min_gain]
    tier = max(earned)[1] if earned else None
    return Classification(tier=tier, regression=est.upper_bound_ratio < tolerance)


# --- Parsing -----------------------------------------------------------------------------------


def read_pairs(text: str) -> list[tuple[float, float]]:
    """Parse CSV or TSV with a header naming `base` and `head` (any order, extra columns ignored)."""
    rows = [
        (lineno, line)
        for lineno, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows:
        raise StatsError("no header line; expected a CSV or TSV header with columns 'base' and 'head'")
    header_line, header = rows[0]
    delimiter = "\t" if "\t" in header else ","
    columns = [c.strip().lower() for c in next(csv.reader([header], delimiter=delimiter))]
    index = {}
    for name in ("base", "head"):
        if columns.count(name) != 1:
            found = "missing" if name not in columns else "repeated"
            raise StatsError(f"line {header_line}: column {name!r} is {found} in header {columns}")
        index[name] = columns.index(name)
    if len(rows) == 1:
        raise StatsError(f"no data rows after the header on line {header_line}")
    pairs = []
    for lineno, line in rows[1:]:
        fields = next(csv.reader([line], delimiter=delimiter))
        if len(fields) != len(columns):
            raise StatsError(f"line {lineno}: {len(fields)} fields, but the header has {len(columns)}")
        base, head = (
            _checked_value(fields[index[k]].strip(), f"line {lineno}: {k}") for k in ("base", "head")
        )
        pairs.append((base, head))
    return pairs
