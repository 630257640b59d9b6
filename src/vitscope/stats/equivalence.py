"""``equivalence``: a claim that two things do not differ by more than a stated ``margin`` ("AutoAugment and label
smoothing have no independent effect"), judged by two one-sided t-tests (TOST, Schuirmann 1987) on the same
estimate ``compare`` uses (Welch's, the paired or one-sample t, or the cluster-robust t over images).

* **reproduced** (equivalence shown): both one-sided tests reject a difference of ``margin`` or more, each at
  ``1 - level`` (p < 0.05): the 90 % interval (1 - 2 alpha) lies inside [-margin, +margin];
* **not reproduced**: the 95 % interval lies wholly outside [-margin, +margin]: a real effect larger than the
  margin;
* **inconclusive** otherwise, and always below 2 seeds (or images) per side or with no spread.

The p-values use the exact degrees of freedom (as scipy's ``ttest_ind(equal_var=False)`` does); the intervals,
like ``compare``'s, round them down to 0.01.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from vitscope.stats.distributions import t_quantile, t_sf
from vitscope.stats.estimate import estimate


@dataclass(frozen=True)
class Equivalence:
    """``difference`` = mean(a) - mean(b); [``low``, ``high``] the 1 - 2 alpha (90 %) interval TOST uses and
    [``low95``, ``high95``] the 1 - alpha (95 %) one; ``p_lower`` the p-value against "difference <= -margin",
    ``p_upper`` against "difference >= +margin"; ``verdict`` one of ``VERDICTS`` and ``reason`` in words;
    ``n_a``/``n_b`` the values per side (images when ``unit`` is images; ``n_b`` 0 against a known value)."""

    difference: float
    low: float
    high: float
    low95: float
    high95: float
    p_lower: float
    p_upper: float
    margin: float
    method: str
    df: float
    n_a: int
    n_b: int
    verdict: str
    reason: str
    unit: str = "seeds"
    level: float = 0.95

    def describe(self) -> str:
        """The report's sentence: estimate, both intervals, the two p-values, counts, method, verdict, reason."""
        if math.isnan(self.low):
            return f"{self.difference:+.3g} (no interval; {self.n_a} vs {self.n_b} {self.unit}, {self.method}): " \
                   f"{self.verdict} — {self.reason}"
        inner = round(100 * (2 * self.level - 1))
        return f"{self.difference:+.3g} ({inner}% interval {self.low:+.3g} to {self.high:+.3g}, " \
               f"{round(100 * self.level)}% {self.low95:+.3g} to {self.high95:+.3g}; margin ±{self.margin:.3g}, " \
               f"p = {self.p_lower:.3g} and {self.p_upper:.3g}; {self.n_a} vs {self.n_b} {self.unit}, " \
               f"{self.method}): {self.verdict} — {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ``description``, JSON-ready."""
        return asdict(self) | {"description": self.describe()}


def equivalence(a: Any, b: Any, margin: float, *, paired: bool = False, clusters: Any = None,
                level: float = 0.95) -> Equivalence:
    """Whether mean(a) - mean(b) lies within ±``margin`` (module docstring). ``a``, ``b``, ``paired`` and
    ``clusters`` as for ``compare`` (``b`` one number: a known value); ``level`` the confidence of each one-sided
    test (0.95: p < 0.05 each, a 90 % interval)."""
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"equivalence: margin={margin!r} must be a positive number (the largest difference that "
                         "counts as none)")
    if not 0.5 < level < 1:
        raise ValueError(f"equivalence: level={level!r} must lie in (0.5, 1), e.g. 0.95")
    est = estimate(a, b, paired=paired, clusters=clusters)
    common = {"margin": float(margin), "method": est.method, "df": float(est.df), "n_a": est.n_a, "n_b": est.n_b,
              "unit": est.unit, "level": level}
    notes = [*est.notes, *([est.limits] if est.limits else [])]
    if est.problem or math.isnan(est.se):
        nan = math.nan
        return Equivalence(est.difference, nan, nan, nan, nan, nan, nan, verdict="inconclusive",
                           reason="; ".join([est.problem or "no interval", *notes]), **common)
    d, se, df = est.difference, est.se, est.df
    p_lower = t_sf((d + margin) / se, df)
    p_upper = t_sf((margin - d) / se, df)
    half = t_quantile(level, df) * se
    half95 = t_quantile((1 + level) / 2, df) * se
    low, high, low95, high95 = d - half, d + half, d - half95, d + half95
    alpha = 1 - level
    if max(p_lower, p_upper) < alpha:
        decided, reason = "reproduced", f"equivalence shown: both one-sided tests reject a difference of " \
            f"{margin:.3g} or more (p = {p_lower:.3g} and {p_upper:.3g}, each below {alpha:.2g})"
    elif low95 > margin or high95 < -margin:
        decided, reason = "not reproduced", f"the {round(100 * level)} % interval lies wholly outside " \
            f"±{margin:.3g}: a real effect larger than the margin"
    else:
        decided, reason = "inconclusive", f"the interval reaches beyond the margin ±{margin:.3g} (p = " \
            f"{p_lower:.3g} and {p_upper:.3g}): neither equivalence nor a larger effect is shown"
    return Equivalence(d, low, high, low95, high95, p_lower, p_upper, verdict=decided,
                       reason="; ".join([reason, *notes]), **common)
