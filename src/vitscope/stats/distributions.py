"""Student's t and the normal distribution, as the intervals, tests and power of ``vitscope.stats`` need them (pure:
numpy and mpmath, no scipy)."""

from __future__ import annotations

import math
from functools import lru_cache

import mpmath
import numpy as np
from numpy.polynomial import chebyshev

_erfc = np.frompyfunc(math.erfc, 1, 1)


@lru_cache(maxsize=256)
def normal_quantile(p: float) -> float:
    """The ``p`` quantile (0 < p < 1) of the standard normal."""
    if not 0 < p < 1:
        raise ValueError(f"normal_quantile: p={p} must lie in (0, 1)")
    return float(mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1))


def normal_sf(x: np.ndarray | float) -> np.ndarray:
    """P(Z > x) for the standard normal, elementwise, accurate in the far tail (``math.erfc``)."""
    return 0.5 * _erfc(np.asarray(x, dtype=float) / math.sqrt(2)).astype(float)


def normal_pdf(x: np.ndarray | float) -> np.ndarray:
    """The standard normal density, elementwise."""
    x = np.asarray(x, dtype=float)
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` > 0 degrees of freedom; ``df`` is rounded down
    to 0.01 (a slightly wider, conservative interval; the one rounding every interval here uses)."""
    rounded = math.floor(df * 100) / 100 if math.isfinite(df) else df
    if rounded >= 1 and 0.5 < p < 1:
        return float(t_quantiles(p, np.array([rounded]))[0])
    return _t_quantile(p, rounded)


@lru_cache(maxsize=8192)
def _t_quantile(p: float, df: float) -> float:
    """mpmath's regularised incomplete beta for the tail, Newton's method from the normal quantile (below the
    root, where the upper tail is convex, so the iterates rise to it); +inf for df 0, the normal quantile for df
    infinite."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p={p} must lie in (0.5, 1)")
    z = normal_quantile(p)
    if df <= 0:
        return math.inf
    if math.isinf(df) or df > 1e7:
        return z
    tail, x = 1.0 - p, z
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    for _ in range(100):
        upper = 0.5 * float(mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True))
        density = math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))
        step = (upper - tail) / density
        x += step
        if abs(step) <= 1e-10 * max(1.0, abs(x)):
            break
    return x


def t_quantiles(p: float, df: np.ndarray) -> np.ndarray:
    """``t_quantile(p, df)`` for many ``df`` >= 1 at once, unrounded: a Chebyshev interpolant of log t_p in 1/df
    on [0, 1] (25 mpmath quantiles per ``p``, once; relative error below 1e-12, checked in the tests)."""
    df = np.asarray(df, dtype=float)
    if df.size and not (df >= 1).all():
        raise ValueError(f"t_quantiles: every df must be >= 1 (got min {df.min():.3g}); use t_quantile below 1")
    return np.exp(_log_t_interpolant(float(p))(1.0 / df))


@lru_cache(maxsize=32)
def _log_t_interpolant(p: float) -> chebyshev.Chebyshev:
    def log_quantile(x: np.ndarray) -> np.ndarray:
        return np.array([math.log(_t_quantile(p, 1.0 / v) if v > 0 else _t_quantile(p, math.inf)) for v in x])
    return chebyshev.Chebyshev.interpolate(log_quantile, 24, domain=[0.0, 1.0])


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` > 0 degrees of freedom (exact ``df``, not rounded: the one-sided
    p-value of a t statistic ``t``)."""
    if not df > 0:
        raise ValueError(f"t_sf: df={df} must be positive")
    if math.isnan(t):
        return math.nan
    if math.isinf(df):
        return float(normal_sf(t))
    tail = 0.5 * float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))
    return tail if t >= 0 else 1.0 - tail
