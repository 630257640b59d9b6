"""The estimate every claim is judged on: mean(a) - mean(b), its standard error and degrees of freedom, for the
design at hand (pure numpy). ``compare`` builds its interval and verdict from it, ``equivalence`` its two one-sided
tests, and both their power from the plug-in spread it carries.

* seeds, unpaired: Welch's standard error with Welch-Satterthwaite degrees of freedom;
* one side a known value (``b`` a number, not a sequence: e.g. softmax's fraction of exact zeros, 0 by
  construction): the one-sample t of ``a`` against it, df n - 1;
* seeds, paired: the t of the differences, df n - 1;
* one side with a single seed: a pooled-variance t, shown but never judged;
* per-unit values with ``clusters``: the cluster-robust (CR2) standard error over images (``cluster_robust_se``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

MIN_PER_SIDE = 2


@dataclass(frozen=True)
class Estimate:
    """``difference`` with its standard error ``se`` and degrees of freedom ``df`` (NaN when none: ``problem``
    says why); ``n_a``/``n_b`` the values used per side (images when ``unit`` is images; ``n_b`` 0 against a known
    value); ``sd_a``/``sd_b`` the plug-in standard deviations of the test's power (per value, or per image;
    ``sd_b`` 0: the one-sample test of side a, with ``n_a`` values); ``pooled``: a pooled-variance t, shown only;
    ``limits``: a stated limit of the interval's coverage, for reports to print."""

    difference: float
    se: float
    df: float
    method: str
    n_a: int
    n_b: int
    unit: str = "seeds"
    notes: tuple[str, ...] = ()
    problem: str = ""
    pooled: bool = False
    sd_a: float = math.nan
    sd_b: float = math.nan
    known_b: float | None = None
    limits: str = ""


def is_known_value(b: Any) -> bool:
    """Whether ``b`` is one number (a known value), not a sequence of values."""
    return isinstance(b, Real) or (isinstance(b, np.ndarray) and b.ndim == 0)


def _finite(values: Any) -> tuple[np.ndarray, int]:
    arr = np.asarray(values, dtype=float).ravel()
    keep = np.isfinite(arr)
    return arr[keep], int((~keep).sum())


def _missing(dropped: int, what: str = "values") -> tuple[str, ...]:
    return (f"{dropped} missing (NaN) {what} left out",) if dropped else ()


def estimate(a: Any, b: Any, *, paired: bool = False, clusters: Any = None) -> Estimate:
    """The estimate of mean(a) - mean(b) for the design the arguments name (module docstring; ``compare``'s
    arguments)."""
    if clusters is not None:
        return _clustered(a, b, paired=paired, clusters=clusters)
    if is_known_value(b):
        return _one_sample(a, float(b))
    if paired:
        return _paired(a, b)
    return _welch(a, b)


def _one_sample(a: Any, known: float, *, dropped_what: str = "values") -> Estimate:
    if not math.isfinite(known):
        raise ValueError(f"compare: a known value b={known} must be finite")
    xa, dropped = _finite(a)
    n = xa.size
    difference = float(xa.mean() - known) if n else math.nan
    common = {"unit": "seeds", "notes": _missing(dropped, dropped_what), "known_b": known}
    method = f"one-sample t against the known value {known:.3g}"
    if n < MIN_PER_SIDE:
        return Estimate(difference, math.nan, math.nan, "none", n, 0, problem=f"needs >= {MIN_PER_SIDE} seeds "
                        f"against a known value (has {n})", **common)
    sd = float(xa.std(ddof=1))
    if sd == 0:
        return Estimate(difference, math.nan, math.nan, method, n, 0, problem="no spread between seeds (identical "
                        "values: are the runs really different seeds?)", **common)
    return Estimate(difference, sd / math.sqrt(n), n - 1, f"{method} (df {n - 1})", n, 0, sd_a=sd, sd_b=0.0,
                    **common)


def _paired(a: Any, b: Any) -> Estimate:
    xa, xb = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if xa.shape != xb.shape:
        raise ValueError(f"compare: paired values need equal counts (got {xa.size} and {xb.size}); "
                         "pass paired=False for independent seeds")
    delta, dropped = _finite(xa - xb)
    n = delta.size
    difference = float(delta.mean()) if n else math.nan
    notes = (f"{dropped} pairs with a missing (NaN) value left out",) if dropped else ()
    if n < MIN_PER_SIDE:
        return Estimate(difference, math.nan, math.nan, "none", n, n, notes=notes,
                        problem=f"needs >= {MIN_PER_SIDE} pairs (has {n})")
    sd = float(delta.std(ddof=1))
    if sd == 0:
        return Estimate(difference, math.nan, math.nan, "paired t", n, n, notes=notes,
                        problem="every pair differs by the same amount: no spread to build an interval")
    return Estimate(difference, sd / math.sqrt(n), n - 1, f"paired t (df {n - 1})", n, n, notes=notes, sd_a=sd,
                    sd_b=0.0)


def _welch(a: Any, b: Any) -> Estimate:
    xa, dropped_a = _finite(a)
    xb, dropped_b = _finite(b)
    notes = _missing(dropped_a + dropped_b)
    n_a, n_b = xa.size, xb.size
    difference = float(xa.mean() - xb.mean()) if n_a and n_b else math.nan
    if min(n_a, n_b) < MIN_PER_SIDE:
        problem = f"needs >= {MIN_PER_SIDE} seeds per side (has {n_a} vs {n_b})"
        if n_a + n_b >= 3 and min(n_a, n_b) == 1:  # the spread of the larger side sizes the noise: shown only
            spread = float(np.sqrt(((n_a - 1) * xa.var(ddof=1) if n_a > 1 else 0.0)
                                   + ((n_b - 1) * xb.var(ddof=1) if n_b > 1 else 0.0)) / math.sqrt(n_a + n_b - 2))
            if spread > 0:
                return Estimate(difference, spread * math.sqrt(1 / n_a + 1 / n_b), n_a + n_b - 2,
                                "pooled-variance t (one side has one seed: equal spread assumed, shown only)", n_a,
                                n_b, notes=notes, problem=problem, pooled=True, sd_a=spread, sd_b=spread)
        return Estimate(difference, math.nan, math.nan, "none", n_a, n_b, notes=notes, problem=problem)
    sd_a, sd_b = float(xa.std(ddof=1)), float(xb.std(ddof=1))
    va, vb = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    if va + vb == 0:
        return Estimate(difference, math.nan, math.nan, "Welch t", n_a, n_b, notes=notes, problem="no spread "
                        "between seeds on either side (identical values: are the runs really different seeds?)")
    df = (va + vb) ** 2 / ((va ** 2 / (n_a - 1) if va else 0.0) + (vb ** 2 / (n_b - 1) if vb else 0.0))
    return Estimate(difference, math.sqrt(va + vb), df, f"Welch t (df {df:.1f})", n_a, n_b, notes=notes, sd_a=sd_a,
                    sd_b=sd_b, limits=two_per_side_limit("seeds") if min(n_a, n_b) == 2 else "")


def two_per_side_limit(unit: str) -> str:
    """The stated limit of the two-sided intervals at 2 values on a side (Welch's over seeds, and the cluster-robust
    one over images, whose df is built as Welch's): in simulation they cover 0.93-0.94, not 0.95, when one side's
    spread is ten or more times the other's (0.95 or more at ratios up to 4, and from 3 per side)."""
    return f"with 2 {unit} on a side this interval covers about 0.94, not 0.95, when one side's spread is ten or " \
           "more times the other's"


def _clustered(a: Any, b: Any, *, paired: bool, clusters: Any) -> Estimate:
    """The difference of the units' means with the cluster-robust standard error over images: images, not units,
    are the independent draws, and an image may hold units of both sides."""
    xa = np.asarray(a, dtype=float).ravel()
    known = float(b) if is_known_value(b) else None
    if known is not None and not math.isfinite(known):
        raise ValueError(f"compare: a known value b={known} must be finite")
    if paired or known is not None:
        xb = np.full(xa.size, float(b)) if is_known_value(b) else np.asarray(b, dtype=float).ravel()
        ca = np.asarray(clusters).ravel()
        if not xa.size == xb.size == ca.size:
            raise ValueError(f"compare: paired clustered values need equal counts (a {xa.size}, b {xb.size}, "
                             f"clusters {ca.size})")
        xa, xb, cb = xa - xb, np.zeros(0), ca[:0]
        paired = True
    else:
        xb = np.asarray(b, dtype=float).ravel()
        if not (isinstance(clusters, (tuple, list)) and len(clusters) == 2):
            raise ValueError("compare: unpaired clustered values need clusters=(clusters_a, clusters_b), one image "
                             "label per value of each side")
        ca, cb = np.asarray(clusters[0]).ravel(), np.asarray(clusters[1]).ravel()
        if ca.size != xa.size or cb.size != xb.size:
            raise ValueError(f"compare: clusters name {ca.size} and {cb.size} units but a has {xa.size} and b "
                             f"{xb.size} values")
    keep_a, keep_b = np.isfinite(xa), np.isfinite(xb)
    notes = _missing(int((~keep_a).sum() + (~keep_b).sum()))
    xa, ca, xb, cb = xa[keep_a], ca[keep_a], xb[keep_b], cb[keep_b]
    images, index = np.unique(np.concatenate([ca, cb]), return_inverse=True)
    ia, ib = index[:ca.size], index[ca.size:]
    n_a = np.unique(ia).size
    n_b = (0 if known is not None else n_a) if paired else np.unique(ib).size
    difference = float(xa.mean() - (0.0 if paired else xb.mean())) if xa.size and (paired or xb.size) else math.nan
    method = "cluster-robust t over images" + (f" against the known value {known:.3g}" if known is not None
                                                else " (paired)" if paired else "")
    common = {"unit": "images", "notes": notes, "known_b": known}
    if (n_a if paired else min(n_a, n_b)) < MIN_PER_SIDE:
        return Estimate(difference, math.nan, math.nan, method, n_a, n_b,
                        problem=f"needs >= {MIN_PER_SIDE} images per side (has {n_a} vs {n_b})" if not paired
                        else f"needs >= {MIN_PER_SIDE} images (has {n_a})", **common)
    sums_a = np.bincount(ia, weights=xa, minlength=images.size)
    counts_a = np.bincount(ia, minlength=images.size).astype(float)
    sums_b = np.bincount(ib, weights=xb, minlength=images.size)
    counts_b = np.bincount(ib, minlength=images.size).astype(float)
    se, df, var_a, var_b = _cluster_parts(sums_a, counts_a, sums_b, counts_b)
    if not (se > 0 and df > 0):
        return Estimate(difference, math.nan, math.nan, method, n_a, n_b,
                        problem="no spread between images to build an interval from", **common)
    # power as Welch's (or the one-sample t's) on image means, at the observed total variance split by side
    share = var_a / (var_a + var_b) if var_a + var_b > 0 else 1.0
    sd_a = math.sqrt(se ** 2 * share * n_a)
    sd_b = 0.0 if paired else math.sqrt(se ** 2 * (1 - share) * n_b)
    limits = two_per_side_limit("images") if min(n_a, n_b) == 2 and not paired else ""
    return Estimate(difference, se, df, f"{method}, df {df:.1f}", n_a, n_b, sd_a=sd_a, sd_b=sd_b, limits=limits,
                    **common)


def cluster_robust_se(sums_a: np.ndarray, counts_a: np.ndarray, sums_b: np.ndarray, counts_b: np.ndarray
                      ) -> tuple[float, float]:
    """Standard error and degrees of freedom of ``mean_a - mean_b`` (each the mean over its units) from per-image
    sums and unit counts (G,) of both sides (zeros where an image has no unit on a side; ``counts_b`` all zero for
    a one-sample mean): the CR2 (bias-reduced, Bell and McCaffrey 2002) cluster-robust variance of the difference
    of two group means, with Satterthwaite degrees of freedom (Bell and McCaffrey; Imbens and Kolesár 2016) under a
    working model in which a side's units in one image share one image effect and each side has its own variance,
    set from that side's own CR2 contribution (as Welch's df sets them from the two sample variances). For one
    sample of G equal-sized images this is the t-interval of the G image means (df G - 1); for two disjoint sides
    of equal-sized images, Welch's interval on the image means, df included. (Independent units with one common
    variance, Imbens and Kolesár's working model, covered only 0.90 at 3 v 3 images with image-level spreads 2 and
    0.5; this one holds 0.95 there, and 0.94-0.97 from 2 to 10 images per side at spread ratios 1 and 4.)"""
    se, df, _, _ = _cluster_parts(sums_a, counts_a, sums_b, counts_b)
    return se, df


@dataclass(frozen=True)
class _Side:
    """One side's CR2 scores (G,) and its G x G Satterthwaite matrix under the working model (unit variance),
    B = diag(d) + L C L' with L (G, 2) and C (2, 2): B's traces then cost O(G)."""

    score: np.ndarray
    d: np.ndarray
    low_rank: np.ndarray
    core: np.ndarray

    def trace(self) -> float:
        return float(self.d.sum() + np.trace(self.core @ self.low_rank.T @ self.low_rank))

    def trace_product(self, other: _Side) -> float:
        """tr(B_self B_other)."""
        cross = self.low_rank.T @ other.low_rank
        return float(self.d @ other.d + np.trace(other.core @ other.low_rank.T @ (self.d[:, None] * other.low_rank))
                     + np.trace(self.core @ self.low_rank.T @ (other.d[:, None] * self.low_rank))
                     + np.trace(self.core @ cross @ other.core @ cross.T))


def _side(sums: np.ndarray, counts: np.ndarray) -> _Side:
    """A side's CR2 scores f (sum_g - mean c_g) / n, f = 1 / sqrt(1 - c_g / n) (the leverage of the image's units),
    and B = M'M with M = diag(p) - u p', p = f c / n, u = c / n: the images' contrast vectors after the side's mean
    is removed, summed within images (the working model's shared image effect)."""
    n = counts.sum()
    mean = sums.sum() / n
    with np.errstate(divide="ignore"):
        f = np.where(counts > 0, 1 / np.sqrt(np.clip(1 - counts / n, 0, None)), 0.0)
    p, u = counts * f / n, counts / n
    score = f * (sums - mean * counts) / n
    return _Side(score, p ** 2, np.stack([p, p * u], axis=1), np.array([[u @ u, -1.0], [-1.0, 0.0]]))


def _cluster_parts(sums_a: np.ndarray, counts_a: np.ndarray, sums_b: np.ndarray, counts_b: np.ndarray
                   ) -> tuple[float, float, float, float]:
    """(se, df, side a's and side b's CR2 variance contributions) of ``cluster_robust_se``."""
    side_a = _side(sums_a, counts_a)
    if not np.isfinite(side_a.score).all():
        return math.nan, math.nan, math.nan, math.nan  # one image holds all of a side's units
    var_a = float(side_a.score @ side_a.score)
    if counts_b.sum() == 0:
        square = side_a.trace_product(side_a)
        return math.sqrt(var_a), (side_a.trace() ** 2 / square if square > 0 else math.nan), var_a, 0.0
    side_b = _side(sums_b, counts_b)
    if not np.isfinite(side_b.score).all():
        return math.nan, math.nan, math.nan, math.nan
    variance = float(((side_a.score - side_b.score) ** 2).sum())
    var_b = float(side_b.score @ side_b.score)
    # B = lambda_a B_a + lambda_b B_b, lambda = a side's contribution / tr(B_side): df = tr(B)^2 / tr(B^2)
    la, lb = var_a / side_a.trace(), var_b / side_b.trace()
    square = la ** 2 * side_a.trace_product(side_a) + lb ** 2 * side_b.trace_product(side_b) \
        + 2 * la * lb * side_a.trace_product(side_b)
    df = (var_a + var_b) ** 2 / square if square > 0 else math.nan
    return math.sqrt(variance), df, var_a, var_b
