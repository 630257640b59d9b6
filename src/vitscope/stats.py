"""The one decision rule for every claim a study checks: an interval, a verdict and a power line (pure functions).

The unit of a claim about training (a protocol, a normaliser, registers) is the seed: ``a`` and ``b`` hold one
value per seed and every value is used, whatever the counts. ``compare`` gives the difference ``mean(a) - mean(b)``
and its 95 % interval:

* seeds, unpaired: Welch's t-interval (Welch-Satterthwaite degrees of freedom), whose coverage holds at 2-10 seeds
  per side where a percentile bootstrap's does not;
* seeds, paired (``paired=True``, the same seeds or images on both sides): the t-interval of the differences;
* per-unit values with ``clusters`` (tokens and the image each came from): a cluster-robust t interval over
  images, never tokens, since tokens of one image are not independent (``cluster_robust_se``: the bias-reduced
  CR2 variance with Satterthwaite degrees of freedom, about G - 1 for G images). Its coverage holds from 2 images
  per side; an image-resampling percentile bootstrap's did not (0.75 at 3 images per side, 0.92 at 30).

The rule, with ``sign`` the paper's direction (+1 or -1) and ``threshold`` half the paper's effect (a magnitude):

* **reproduced**: the interval excludes zero in the paper's direction and the estimate reaches the threshold;
* **not reproduced**: the whole interval lies below the threshold in the paper's direction;
* **inconclusive** otherwise, and always below 2 seeds (or 2 images) per side, or when there is no spread to
  build an interval from; ``reason`` says why.

Power, from the observed spread: ``min_detectable`` is the smallest effect these seeds would detect with 80 %
power at a two-sided 5 % level, and ``seeds_needed`` the seeds per side the paper's effect (twice the threshold)
would need at that spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import mpmath
import numpy as np

LEVEL = 0.95
POWER = 0.80
MIN_PER_SIDE = 2
MAX_SEEDS = 1000
VERDICTS = ("reproduced", "not reproduced", "inconclusive")


@dataclass(frozen=True)
class Comparison:
    """``difference`` = mean(a) - mean(b) with its 95 % interval [``low``, ``high``] (NaN when none can be built);
    ``verdict`` one of ``VERDICTS`` and ``reason`` in words; ``n_a``/``n_b`` the values used per side (seeds, or
    images when clustered); ``min_detectable`` and ``seeds_needed`` the power (module docstring; NaN / None when
    the spread is unknown)."""

    difference: float
    low: float
    high: float
    method: str
    n_a: int
    n_b: int
    verdict: str
    reason: str
    sign: int
    threshold: float
    min_detectable: float
    seeds_needed: int | None
    unit: str = "seeds"

    @property
    def paper_effect(self) -> float:
        """The paper's effect in its own direction: twice the threshold."""
        return 2.0 * self.threshold

    def power_line(self) -> str:
        """What these seeds can detect and what the paper's effect would need, in one sentence."""
        if math.isnan(self.min_detectable):
            if min(self.n_a, self.n_b) < MIN_PER_SIDE:
                return f"needs >= {MIN_PER_SIDE} {self.unit} per side to measure the noise"
            return "no spread between values to size the noise from"
        line = f"these {self.unit} detect effects of about {self.min_detectable:.3g} or more"
        if self.unit != "seeds":
            return line
        if self.seeds_needed is None:
            return f"{line}; the paper's effect ({self.paper_effect:.3g}) needs more than {MAX_SEEDS} seeds per side " \
                   "at this noise"
        return f"{line}; needs about {self.seeds_needed} seeds per side at this noise for the paper's effect " \
               f"({self.paper_effect:.3g})"

    def describe(self) -> str:
        """The report's sentence: estimate, interval, counts, method, verdict, reason and power."""
        interval = f"95% interval {self.low:+.3g} to {self.high:+.3g}" if not math.isnan(self.low) else "no interval"
        return f"{self.difference:+.3g} ({interval}; {self.n_a} vs {self.n_b} {self.unit}, {self.method}): " \
               f"{self.verdict} — {self.reason}; {self.power_line()}"

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ``paper_effect``, ``power_line`` and ``description``, JSON-ready."""
        return asdict(self) | {"paper_effect": self.paper_effect, "power_line": self.power_line(),
                               "description": self.describe()}


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` > 0 degrees of freedom; ``df`` is rounded down
    to 0.01 (a slightly wider, conservative interval, and a cache that makes simulations fast)."""
    return _t_quantile(p, math.floor(df * 100) / 100 if math.isfinite(df) else df)


@lru_cache(maxsize=8192)
def _t_quantile(p: float, df: float) -> float:
    """mpmath's regularised incomplete beta for the tail, Newton's method from the normal quantile (below the
    root, where the upper tail is convex, so the iterates rise to it); +inf for df 0, the normal quantile for df
    infinite."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p={p} must lie in (0.5, 1)")
    z = float(mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1))
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


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / n`` (e.g. a probe's top-1 over ``n`` test
    images): (low, high) in [0, 1]. It stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal
    (Wald) interval does not."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    if not 0 < level < 1:
        raise ValueError(f"wilson_interval: level={level} must lie in (0, 1), e.g. 0.95")
    z = float(mpmath.sqrt(2) * mpmath.erfinv(level))
    p, z2 = successes / n, z * z / n
    centre = (p + z2 / 2) / (1 + z2)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n)) / (1 + z2)
    return max(0.0, centre - half), min(1.0, centre + half)


def _finite(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, int]:
    arr = np.asarray(values, dtype=float).ravel()
    keep = np.isfinite(arr)
    return arr[keep], int((~keep).sum())


def judge(difference: float, low: float, high: float, *, sign: int, threshold: float) -> tuple[str, str]:
    """The rule (module docstring) on an estimate and its interval: (verdict, reason)."""
    if any(math.isnan(v) for v in (difference, low, high)):
        return "inconclusive", "no interval"
    effect = sign * difference
    lo, hi = sorted((sign * low, sign * high))
    if lo > 0 and effect >= threshold:
        return "reproduced", f"the interval excludes zero in the paper's direction and the estimate reaches " \
                             f"half the paper's effect ({threshold:.3g})"
    if hi < threshold:
        return "not reproduced", f"the whole interval lies below half the paper's effect ({threshold:.3g}) in " \
                                 "the paper's direction"
    if lo > 0:
        return "inconclusive", f"an effect in the paper's direction, but the estimate is short of half the " \
                               f"paper's effect ({threshold:.3g})"
    return "inconclusive", f"the interval reaches both zero and half the paper's effect ({threshold:.3g})"


def _check_rule(sign: int, threshold: float) -> None:
    if sign not in (1, -1):
        raise ValueError(f"compare: sign={sign!r} must be +1 or -1 (the paper's direction)")
    if not (threshold > 0 and math.isfinite(threshold)):
        raise ValueError(f"compare: threshold={threshold!r} must be a positive number (half the paper's effect)")


def _seeds_needed(spread: float, threshold: float, paired: bool) -> int | None:
    """Seeds per side (pairs when paired) at which the t-test detects twice ``threshold`` with 80 % power, given
    the per-seed standard deviation ``spread`` (of the differences when paired); None past ``MAX_SEEDS``."""
    effect = 2.0 * threshold
    factor = 1.0 if paired else 2.0
    z = t_quantile((1 + LEVEL) / 2, math.inf) + t_quantile(POWER, math.inf)
    n = max(MIN_PER_SIDE, math.floor(factor * (z * spread / effect) ** 2))
    while n <= MAX_SEEDS:
        df = n - 1 if paired else 2 * n - 2
        if (t_quantile((1 + LEVEL) / 2, df) + t_quantile(POWER, df)) * spread * math.sqrt(factor / n) <= effect:
            return n
        n += 1
    return None


def _result(difference: float, low: float, high: float, method: str, n_a: int, n_b: int, *, sign: int,
            threshold: float, min_detectable: float, seeds_needed: int | None, notes: list[str],
            unit: str = "seeds", verdict: tuple[str, str] | None = None) -> Comparison:
    verdict_text, reason = verdict or judge(difference, low, high, sign=sign, threshold=threshold)
    return Comparison(float(difference), float(low), float(high), method, n_a, n_b, verdict_text,
                      "; ".join([reason, *notes]), sign, float(threshold), float(min_detectable), seeds_needed, unit)


def compare(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, sign: int, threshold: float,
            paired: bool = False, clusters: Any = None) -> Comparison:
    """mean(a) - mean(b), its 95 % interval and the verdict of the one rule (module docstring).

    ``a``, ``b``: per-seed values (every finite value used; NaN and inf dropped and counted in ``reason``), or
    per-unit values with ``clusters``: for unpaired values a pair ``(clusters_a, clusters_b)`` naming each unit's
    image, for paired values one sequence. ``paired``: ``a[i]`` and ``b[i]`` share a seed or an image.
    """
    _check_rule(sign, threshold)
    if clusters is not None:
        return _compare_clustered(a, b, sign=sign, threshold=threshold, paired=paired, clusters=clusters)
    if paired:
        return _compare_paired(a, b, sign=sign, threshold=threshold)
    xa, dropped_a = _finite(a)
    xb, dropped_b = _finite(b)
    notes = [f"{dropped_a + dropped_b} missing (NaN) values left out"] if dropped_a + dropped_b else []
    n_a, n_b = xa.size, xb.size
    difference = float(xa.mean() - xb.mean()) if n_a and n_b else math.nan
    if min(n_a, n_b) < MIN_PER_SIDE:
        too_few = ("inconclusive", f"needs >= {MIN_PER_SIDE} seeds per side (has {n_a} vs {n_b})")
        if n_a + n_b >= 3 and min(n_a, n_b) == 1:  # the spread of the larger side sizes the need, and a pooled
            spread = float(np.sqrt(((n_a - 1) * xa.var(ddof=1) if n_a > 1 else 0.0)  # interval is shown
                                   + ((n_b - 1) * xb.var(ddof=1) if n_b > 1 else 0.0)) / math.sqrt(n_a + n_b - 2))
            se = spread * math.sqrt(1 / n_a + 1 / n_b)
            half = t_quantile((1 + LEVEL) / 2, n_a + n_b - 2) * se
            needed = _seeds_needed(spread, threshold, paired=False) if spread > 0 else None
            detect = (t_quantile((1 + LEVEL) / 2, n_a + n_b - 2) + t_quantile(POWER, n_a + n_b - 2)) * se \
                if spread > 0 else math.nan
            return _result(difference, difference - half, difference + half, "pooled-variance t (one side has one "
                           "seed: equal spread assumed, shown only)", n_a, n_b, sign=sign, threshold=threshold,
                           min_detectable=detect, seeds_needed=needed, notes=notes, verdict=too_few)
        return _result(difference, math.nan, math.nan, "none", n_a, n_b, sign=sign, threshold=threshold,
                       min_detectable=math.nan, seeds_needed=None, notes=notes, verdict=too_few)
    va, vb = xa.var(ddof=1) / n_a, xb.var(ddof=1) / n_b
    se = math.sqrt(va + vb)
    if se == 0:
        return _result(difference, math.nan, math.nan, "Welch t", n_a, n_b, sign=sign, threshold=threshold,
                       min_detectable=math.nan, seeds_needed=None, notes=notes, verdict=(
                           "inconclusive", "no spread between seeds on either side (identical values: are the "
                           "runs really different seeds?)"))
    df = (va + vb) ** 2 / ((va ** 2 / (n_a - 1) if va else 0.0) + (vb ** 2 / (n_b - 1) if vb else 0.0))
    half = t_quantile((1 + LEVEL) / 2, df) * se
    detect = (t_quantile((1 + LEVEL) / 2, df) + t_quantile(POWER, df)) * se
    spread = math.sqrt((xa.var(ddof=1) + xb.var(ddof=1)) / 2)
    return _result(difference, difference - half, difference + half, f"Welch t (df {df:.1f})", n_a, n_b,
                   sign=sign, threshold=threshold, min_detectable=detect,
                   seeds_needed=_seeds_needed(spread, threshold, paired=False), notes=notes)


def _compare_paired(a: Any, b: Any, *, sign: int, threshold: float) -> Comparison:
    xa, xb = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if xa.shape != xb.shape:
        raise ValueError(f"compare: paired values need equal counts (got {xa.size} and {xb.size}); "
                         "pass paired=False for independent seeds")
    delta, dropped = _finite(xa - xb)
    notes = [f"{dropped} pairs with a missing (NaN) value left out"] if dropped else []
    n = delta.size
    difference = float(delta.mean()) if n else math.nan
    if n < MIN_PER_SIDE:
        return _result(difference, math.nan, math.nan, "none", n, n, sign=sign, threshold=threshold,
                       min_detectable=math.nan, seeds_needed=None, notes=notes,
                       verdict=("inconclusive", f"needs >= {MIN_PER_SIDE} pairs (has {n})"))
    spread = float(delta.std(ddof=1))
    if spread == 0:
        return _result(difference, math.nan, math.nan, "paired t", n, n, sign=sign, threshold=threshold,
                       min_detectable=math.nan, seeds_needed=None, notes=notes, verdict=(
                           "inconclusive", "every pair differs by the same amount: no spread to build an interval"))
    se = spread / math.sqrt(n)
    half = t_quantile((1 + LEVEL) / 2, n - 1) * se
    detect = (t_quantile((1 + LEVEL) / 2, n - 1) + t_quantile(POWER, n - 1)) * se
    return _result(difference, difference - half, difference + half, f"paired t (df {n - 1})", n, n, sign=sign,
                   threshold=threshold, min_detectable=detect,
                   seeds_needed=_seeds_needed(spread, threshold, paired=True), notes=notes)


def _compare_clustered(a: Any, b: Any, *, sign: int, threshold: float, paired: bool, clusters: Any) -> Comparison:
    """The difference of the units' means with a cluster-robust t interval over images (``cluster_robust_se``):
    images, not units, are the independent draws, and an image may hold units of both sides."""
    xa, xb = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if paired:
        ca = cb = np.asarray(clusters).ravel()
        if not xa.size == xb.size == ca.size:
            raise ValueError(f"compare: paired clustered values need equal counts (a {xa.size}, b {xb.size}, "
                             f"clusters {ca.size})")
        xa, xb, ca, cb = xa - xb, np.zeros(0), ca, ca[:0]
    else:
        if not (isinstance(clusters, (tuple, list)) and len(clusters) == 2):
            raise ValueError("compare: unpaired clustered values need clusters=(clusters_a, clusters_b), one image "
                             "label per value of each side")
        ca, cb = np.asarray(clusters[0]).ravel(), np.asarray(clusters[1]).ravel()
        if ca.size != xa.size or cb.size != xb.size:
            raise ValueError(f"compare: clusters name {ca.size} and {cb.size} units but a has {xa.size} and b "
                             f"{xb.size} values")
    keep_a, keep_b = np.isfinite(xa), np.isfinite(xb)
    dropped = int((~keep_a).sum() + (~keep_b).sum())
    notes = [f"{dropped} missing (NaN) values left out"] if dropped else []
    xa, ca, xb, cb = xa[keep_a], ca[keep_a], xb[keep_b], cb[keep_b]
    images, index = np.unique(np.concatenate([ca, cb]), return_inverse=True)
    ia, ib = index[:ca.size], index[ca.size:]
    n_a, n_b = np.unique(ia).size, (np.unique(ib).size if not paired else np.unique(ia).size)
    difference = float(xa.mean() - (xb.mean() if not paired else 0.0)) if xa.size and (paired or xb.size) \
        else math.nan
    method = "cluster-robust t over images" + (" (paired)" if paired else "")
    if min(n_a, n_b) < MIN_PER_SIDE:
        return _result(difference, math.nan, math.nan, method, n_a, n_b, sign=sign, threshold=threshold,
                       min_detectable=math.nan, seeds_needed=None, notes=notes, unit="images", verdict=(
                           "inconclusive", f"needs >= {MIN_PER_SIDE} images per side (has {n_a} vs {n_b})"))
    sums_a = np.bincount(ia, weights=xa, minlength=images.size)
    counts_a = np.bincount(ia, minlength=images.size).astype(float)
    sums_b = np.bincount(ib, weights=xb, minlength=images.size)
    counts_b = np.bincount(ib, minlength=images.size).astype(float)
    se, df = cluster_robust_se(sums_a, counts_a, sums_b, counts_b)
    if not se > 0:
        return _result(difference, math.nan, math.nan, method, n_a, n_b, sign=sign, threshold=threshold,
                       min_detectable=math.nan, seeds_needed=None, notes=notes, unit="images", verdict=(
                           "inconclusive", "no spread between images to build an interval from"))
    half = t_quantile((1 + LEVEL) / 2, df) * se
    detect = (t_quantile((1 + LEVEL) / 2, df) + t_quantile(POWER, df)) * se
    return _result(difference, difference - half, difference + half, f"{method}, df {df:.1f}", n_a, n_b,
                   sign=sign, threshold=threshold, min_detectable=detect, seeds_needed=None, notes=notes,
                   unit="images")


def cluster_robust_se(sums_a: np.ndarray, counts_a: np.ndarray, sums_b: np.ndarray, counts_b: np.ndarray
                      ) -> tuple[float, float]:
    """Standard error and degrees of freedom of ``mean_a - mean_b`` (each the mean over its units) from per-image
    sums and unit counts (G,) of both sides (zeros where an image has no unit on a side; ``counts_b`` all zero for
    a one-sample mean): the CR2 (bias-reduced, Bell and McCaffrey 2002) cluster-robust variance of the difference
    of two group means, with its Satterthwaite degrees of freedom under equal-variance errors (Imbens and Kolesár
    2016). For one sample of G equal-sized images this is the t-interval of the G image means (df G - 1); for two
    disjoint sides of equal-sized images, Welch's standard error of the image means (df G_a + G_b - 2 when
    G_a = G_b)."""
    n_a, n_b = counts_a.sum(), counts_b.sum()
    mean_a = sums_a.sum() / n_a
    mean_b = sums_b.sum() / n_b if n_b else 0.0
    # each image's share of a side, and its CR2 factor 1 / sqrt(1 - share) (the leverage of its units' mean)
    share_a = counts_a / n_a
    share_b = counts_b / n_b if n_b else np.zeros_like(counts_b)
    with np.errstate(divide="ignore"):
        fa = np.where(counts_a > 0, 1 / np.sqrt(np.clip(1 - share_a, 0, None)), 0.0)
        fb = np.where(counts_b > 0, 1 / np.sqrt(np.clip(1 - share_b, 0, None)), 0.0)
    if not (np.isfinite(fa).all() and np.isfinite(fb).all()):
        return math.nan, math.nan  # one image holds all of a side's units
    score = fa * (sums_a - mean_a * counts_a) / n_a - (fb * (sums_b - mean_b * counts_b) / n_b if n_b else 0.0)
    variance = float((score ** 2).sum())
    # Satterthwaite: B = Q'(I - H)Q, G x G, with Q's columns the images' CR2 contrast vectors; df = tr(B)^2/tr(B^2)
    diag = counts_a * fa ** 2 / n_a ** 2 + (counts_b * fb ** 2 / n_b ** 2 if n_b else 0.0)
    p = counts_a * fa / n_a
    w = counts_b * fb / n_b if n_b else np.zeros_like(counts_b)
    pp, ww, pw = p @ p, w @ w, p @ w
    trace = diag.sum() - pp / n_a - (ww / n_b if n_b else 0.0)
    square = (diag ** 2).sum() + pp ** 2 / n_a ** 2 - 2 * (diag * p ** 2).sum() / n_a
    if n_b:
        square += ww ** 2 / n_b ** 2 - 2 * (diag * w ** 2).sum() / n_b + 2 * pw ** 2 / (n_a * n_b)
    df = trace ** 2 / square if square > 0 else math.nan
    return math.sqrt(variance), df
