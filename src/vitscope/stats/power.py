"""Power of the two-sided t-tests ``vitscope.stats`` uses, for the test actually used (pure: numpy and mpmath).

* ``t_power``: the one-sample t-test (paired values, or one side against a known value) with ``n`` values and
  ``n - 1`` degrees of freedom: exactly the noncentral t's tail, integrated over the chi distribution of the
  sample deviation.
* ``welch_power``: Welch's test, whose degrees of freedom are themselves estimated from the two sample
  variances. Treating them as known (the normal approximation ``(t_0.975 + t_0.8) x SE``) overstates its power
  at few seeds: at 2 seeds a side Welch's test needs about 10.3 sigma for 80 % power, not 5.4 sigma. The power is
  the probability that |mean difference| > t_{df(s_a, s_b)} x SE(s_a, s_b), integrated over the normal
  difference (in closed form) and the two chi-square sample variances (in polar coordinates: the radius carries
  the scale, the angle the ratio that sets Welch's df), with the trapezoid rule on log scales, which converges
  exponentially for these smooth, fast-decaying integrands (error below 1e-6; the tests check it against a
  simulation of scipy's ``ttest_ind(equal_var=False)``).

``min_detectable`` (the effect reached with 80 % power) and ``seeds_needed`` (the seeds per side at which an
effect is) invert them. Sides are given by their true (or plug-in) standard deviations; a side with standard
deviation 0 is a known value, and the test is then the one-sample t of the other side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from vitscope.stats.distributions import normal_pdf, normal_quantile, normal_sf, t_quantiles

LEVEL = 0.95
POWER = 0.80
MAX_SEEDS = 1000
_POINTS = 48  # trapezoid nodes per integrated variable (converged to 1e-9, checked in the tests)
_DROP = 40.0  # each log-density is integrated where it lies within this of its peak (the rest weighs < 1e-17)
_SCAN = 20.0  # |u| scanned for that range: x - mode up to scale x sinh(20), 2e8 widths


def _log_grid(log_density: Callable[[np.ndarray], np.ndarray], mode: float, scale: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and normalised weights for a smooth unimodal log-density (unnormalised) on the real line, peaked at
    ``mode`` with width about ``scale``: the trapezoid rule in u, x = mode + scale sinh(u) (its tails then fall
    double-exponentially), over the range where the density lies within ``_DROP`` of its peak."""
    def in_u(u: np.ndarray) -> np.ndarray:
        return log_density(mode + scale * np.sinh(u)) + np.log(np.cosh(u))
    scan = np.linspace(-_SCAN, _SCAN, 4001)  # u steps of 0.01: the range's ends, to within a step outside it
    with np.errstate(over="ignore", invalid="ignore"):
        levels = in_u(scan)
    peak = float(np.nanmax(levels))
    inside = np.flatnonzero(levels > peak - _DROP)
    ends = scan[max(inside[0] - 1, 0)], scan[min(inside[-1] + 1, scan.size - 1)]
    u = np.linspace(ends[0], ends[1], _POINTS)
    weights = np.exp(in_u(u) - in_u(u).max())
    return mode + scale * np.sinh(u), weights / weights.sum()


@lru_cache(maxsize=1024)
def _radius_grid(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes R and weights of the chi distribution with ``k`` degrees of freedom (R^2 ~ chi-square k), in log R."""
    nodes, weights = _log_grid(lambda t: k * t - 0.5 * np.exp(2 * t), 0.5 * math.log(k), 1 / math.sqrt(2 * k))
    return np.exp(nodes), weights


@lru_cache(maxsize=4096)
def _t_critical(df: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """A t-test with ``df`` degrees of freedom whose standard-error estimate is SE x R / sqrt(df), R ~ chi(df):
    weights and the critical |difference| / SE at each node."""
    radius, weights = _radius_grid(df)
    q = t_quantiles((1 + level) / 2, np.array([float(df)]))[0]
    return weights, q * radius / math.sqrt(df)


@lru_cache(maxsize=1024)
def _angle_grid(ka: int, kb: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes cos^2(phi) and weights of the angle of (sqrt(W_a), sqrt(W_b)), W ~ chi-square ka and kb, so that
    W_a = R^2 cos^2(phi) and W_b = R^2 sin^2(phi) with R^2 ~ chi-square ka + kb independent of phi; integrated in
    psi = log tan(phi), whose log-density is kb psi - (ka + kb) / 2 log(1 + e^(2 psi))."""
    psi, weights = _log_grid(lambda x: kb * x - 0.5 * (ka + kb) * np.logaddexp(0.0, 2 * x), 0.5 * math.log(kb / ka),
                             math.sqrt((ka + kb) / (2 * ka * kb)))
    return 1.0 / (1.0 + np.exp(2 * psi)), weights


@lru_cache(maxsize=64)  # 37 kB each; the ratio of the variances is new for nearly every comparison
def _welch_critical(share_a: float, n_a: int, n_b: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Welch's test with ``share_a`` = (sd_a^2 / n_a) / SE^2 of the true variance on side a: weights and the
    critical |difference| / SE over the joint distribution of the two sample variances (flattened)."""
    ka, kb = n_a - 1, n_b - 1
    cos2, psi_weights = _angle_grid(ka, kb)
    va, vb = share_a / ka * cos2, (1 - share_a) / kb * (1 - cos2)  # estimated SE^2 / (true SE^2 x R^2) by side
    df = (va + vb) ** 2 / (va ** 2 / ka + vb ** 2 / kb)
    q = t_quantiles((1 + level) / 2, np.maximum(df, 1.0))
    radius, radius_weights = _radius_grid(ka + kb)
    critical = (q * np.sqrt(va + vb))[:, None] * radius[None, :]
    return (psi_weights[:, None] * radius_weights[None, :]).ravel(), critical.ravel()


def _power(noncentrality: float, weights: np.ndarray, critical: np.ndarray) -> float:
    """P(|N(ncp, 1)| > critical), averaged with ``weights``."""
    ncp = abs(noncentrality)
    return float(weights @ (_sf(critical - ncp) + _sf(critical + ncp)))


def _sf(x: np.ndarray) -> np.ndarray:
    """P(Z > x), with erfc evaluated only where it differs from 0 or 1 by more than 1e-19 (|x| < 9)."""
    out = (x < 0).astype(float)
    band = np.abs(x) < 9.0
    out[band] = normal_sf(x[band])
    return out


def _grid(sd_a: float, sd_b: float, n_a: int, n_b: int, level: float) -> tuple[float, np.ndarray, np.ndarray]:
    """(true SE of the difference, weights, critical / SE) of the test for these sides."""
    _check_sides(sd_a, sd_b, n_a, n_b, level)
    if sd_b == 0 or sd_a == 0:  # a known side: the one-sample t of the other (Welch's with df n - 1)
        sd, n = (sd_a, n_a) if sd_b == 0 else (sd_b, n_b)
        return sd / math.sqrt(n), *_t_critical(n - 1, level)
    var_a, var_b = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    share = round(var_a / (var_a + var_b), 12)
    return math.sqrt(var_a + var_b), *_welch_critical(share, n_a, n_b, level)


def _check_sides(sd_a: float, sd_b: float, n_a: int, n_b: int, level: float) -> None:
    if not (sd_a >= 0 and sd_b >= 0 and math.isfinite(sd_a) and math.isfinite(sd_b)) or sd_a == sd_b == 0:
        raise ValueError(f"power: sd_a={sd_a}, sd_b={sd_b} must be finite, >= 0 and not both 0 (a side with sd 0 "
                         "is a known value)")
    for name, n, sd in (("n_a", n_a, sd_a), ("n_b", n_b, sd_b)):
        if sd > 0 and not (int(n) == n and n >= 2):
            raise ValueError(f"power: {name}={n} must be a whole number >= 2 (a t-test needs 2 values per side)")
    if not 0 < level < 1:
        raise ValueError(f"power: level={level} must lie in (0, 1), e.g. 0.95")


def welch_power(effect: float, sd_a: float, sd_b: float, n_a: int, n_b: int, level: float = LEVEL) -> float:
    """Power of Welch's two-sided t-test at ``level`` to detect a true difference ``effect`` between sides of
    ``n_a`` and ``n_b`` values with standard deviations ``sd_a`` and ``sd_b`` (module docstring). A side with sd 0
    is a known value: the one-sample t-test of the other side."""
    _check_sides(sd_a, sd_b, n_a, n_b, level)
    se, weights, critical = _grid(float(sd_a), float(sd_b), int(n_a), int(n_b), level)
    return _power(effect / se, weights, critical)


def t_power(effect: float, sd: float, n: int, level: float = LEVEL) -> float:
    """Power of the two-sided one-sample (or paired) t-test at ``level`` with ``n`` values of standard deviation
    ``sd`` to detect a true mean ``effect`` (exact: the noncentral t with ``n - 1`` degrees of freedom)."""
    return welch_power(effect, sd, 0.0, n, 0, level)


def pooled_power(effect: float, sd: float, n_a: int, n_b: int, level: float = LEVEL) -> float:
    """Power of the two-sided pooled-variance (Student's) t-test, both sides with standard deviation ``sd``
    (exact: noncentral t with ``n_a + n_b - 2`` degrees of freedom)."""
    if not (sd > 0 and n_a >= 1 and n_b >= 1 and n_a + n_b >= 3):
        raise ValueError(f"pooled_power: needs sd > 0 and n_a + n_b >= 3 (got sd={sd}, {n_a} and {n_b})")
    se = sd * math.sqrt(1 / n_a + 1 / n_b)
    return _power(effect / se, *_t_critical(n_a + n_b - 2, level))


def _solve_noncentrality(weights: np.ndarray, critical: np.ndarray, power: float) -> float:
    """The noncentrality at which the test has ``power`` (Newton's method, bisection-safeguarded; power to 1e-10)."""
    x = float(weights @ critical) + normal_quantile(power)  # at the mean critical value: close, usually above
    low, high = 0.0, x
    while _power(high, weights, critical) < power:
        low, high = high, 2 * high
    for _ in range(100):
        value = _power(x, weights, critical) - power
        if abs(value) < 1e-10:
            break
        if value < 0:
            low = x
        else:
            high = x
        slope = float(weights @ (normal_pdf(critical - x) - normal_pdf(critical + x)))
        step = x - value / slope if slope > 0 else math.nan
        x = step if low < step < high else (low + high) / 2
        if high - low < 1e-9 * max(1.0, high):
            break
    return x


def min_detectable(sd_a: float, sd_b: float, n_a: int, n_b: int, *, power: float = POWER,
                   level: float = LEVEL) -> float:
    """The smallest true difference Welch's two-sided test at ``level`` detects with probability ``power``,
    given the sides' standard deviations and counts (a side with sd 0: the one-sample t of the other)."""
    if not 0 < power < 1:
        raise ValueError(f"min_detectable: power={power} must lie in (0, 1), e.g. 0.8")
    _check_sides(sd_a, sd_b, n_a, n_b, level)
    return _min_detectable(float(sd_a), float(sd_b), int(n_a), int(n_b), power, level)


@lru_cache(maxsize=4096)
def _min_detectable(sd_a: float, sd_b: float, n_a: int, n_b: int, power: float, level: float) -> float:
    se, weights, critical = _grid(sd_a, sd_b, n_a, n_b, level)
    if power <= 1 - level:
        return 0.0  # the test rejects this often at no effect
    return se * _solve_noncentrality(weights, critical, power)


def pooled_min_detectable(sd: float, n_a: int, n_b: int, *, power: float = POWER, level: float = LEVEL) -> float:
    """``min_detectable`` for the pooled-variance t-test (both sides with standard deviation ``sd``)."""
    pooled_power(1.0, sd, n_a, n_b, level)  # validates
    return sd * math.sqrt(1 / n_a + 1 / n_b) * _solve_noncentrality(*_t_critical(n_a + n_b - 2, level), power)


def seeds_needed(effect: float, sd_a: float, sd_b: float, *, power: float = POWER, level: float = LEVEL,
                 most: int = MAX_SEEDS) -> int | None:
    """The fewest values per side (the same on both; of the sampled side alone when the other has sd 0, a known
    value) at which Welch's two-sided test at ``level`` detects a true difference ``effect`` with probability
    ``power``; None past ``most``."""
    if not (effect != 0 and math.isfinite(effect)):
        raise ValueError(f"seeds_needed: effect={effect} must be a finite non-zero difference")
    return _seeds_needed(abs(float(effect)), float(sd_a), float(sd_b), power, level, int(most))


@lru_cache(maxsize=4096)
def _seeds_needed(effect: float, sd_a: float, sd_b: float, power: float, level: float, most: int) -> int | None:
    def reaches(n: int) -> bool:
        return welch_power(effect, sd_a, sd_b, n, n, level) >= power
    z = normal_quantile((1 + level) / 2) + normal_quantile(power)
    guess = min(most, max(2, math.ceil((z / effect) ** 2 * (sd_a ** 2 + sd_b ** 2))))  # the z-test's need: close
    step = 1
    if reaches(guess):  # gallop down to a count that does not reach, then bisect the last gap
        while guess > 2:
            below = max(2, guess - step)
            if not reaches(below):
                return _first(reaches, below + 1, guess)
            guess, step = below, 2 * step
        return 2
    while guess < most:  # gallop up
        above = min(most, guess + step)
        if reaches(above):
            return _first(reaches, guess + 1, above)
        guess, step = above, 2 * step
    return None


def _first(reaches: Callable[[int], bool], low: int, high: int) -> int:
    """The first n in [low, high] with reaches(n), given reaches(high) (monotone)."""
    while low < high:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle + 1
    return high


def power_sentence(sd_a: float, sd_b: float, n_a: int, n_b: int, *, unit: str = "seeds", power: float = POWER,
                   level: float = LEVEL) -> str:
    """What these counts can say, in one sentence for a report: "with 2 seeds a side, Welch's test has 80 % power
    only for differences of 10.4 or more (two-sided 5 % level, at the observed spread)" for ``sd_a = sd_b = 1``. A
    side with sd 0 is a known value (the one-sample t-test of the other side)."""
    detect = min_detectable(sd_a, sd_b, n_a, n_b, power=power, level=level)
    if sd_b == 0 or sd_a == 0:
        n = n_a if sd_b == 0 else n_b
        return detect_sentence(detect, f"{n} {unit} against a known value", "the one-sample t-test", power, level)
    counts = f"{n_a} {unit} a side" if n_a == n_b else f"{n_a} vs {n_b} {unit}"
    return detect_sentence(detect, counts, "Welch's test", power, level)


def detect_sentence(detect: float, counts: str, test: str, power: float = POWER, level: float = LEVEL) -> str:
    """"with COUNTS, TEST has 80 % power only for differences of DETECT or more (...)": the sentence of
    ``power_sentence`` (and ``Comparison.power_sentence``) from an effect already computed."""
    return f"with {counts}, {test} has {round(100 * power)} % power only for differences of {detect:.3g} or more " \
           f"(two-sided {round(100 * (1 - level))} % level, at the observed spread)"
