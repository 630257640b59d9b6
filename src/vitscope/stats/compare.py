"""``compare``: a difference, its 95 % interval, the verdict of the one rule and the power of the test used; and
``verdict``, through which every study's claim passes (the rule: ``vitscope.stats``'s docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from vitscope.stats.distributions import t_quantile
from vitscope.stats.estimate import MIN_PER_SIDE, Estimate, estimate
from vitscope.stats.power import MAX_SEEDS, detect_sentence, min_detectable, pooled_min_detectable, seeds_needed

LEVEL = 0.95
NOT_TESTABLE = "not testable"
VERDICTS = ("reproduced", "not reproduced", "inconclusive", NOT_TESTABLE)


@dataclass(frozen=True)
class Comparison:
    """``difference`` = mean(a) - mean(b) with its 95 % interval [``low``, ``high``] (NaN when none can be built);
    ``verdict`` one of ``VERDICTS`` and ``reason`` in words; ``n_a``/``n_b`` the values used per side (seeds, or
    images when clustered; ``n_b`` 0 against a known value ``known_b``); ``threshold`` half the paper's effect, or
    None for a claim of direction only; ``min_detectable`` (the true difference the test used detects with 80 %
    power at the observed spread) and ``seeds_needed`` (the seeds per side at which it detects the paper's effect;
    None when unknown or past 1000); ``df`` the interval's degrees of freedom; ``test`` the test the power is for;
    ``limits`` a stated limit of the interval's coverage (also in ``reason``)."""

    difference: float
    low: float
    high: float
    method: str
    n_a: int
    n_b: int
    verdict: str
    reason: str
    sign: int
    threshold: float | None
    min_detectable: float
    seeds_needed: int | None
    unit: str = "seeds"
    df: float = math.nan
    known_b: float | None = None
    test: str = ""
    limits: str = ""

    @property
    def paper_effect(self) -> float | None:
        """The paper's effect in its own direction: twice the threshold (None for a claim of direction only)."""
        return None if self.threshold is None else 2.0 * self.threshold

    def power_line(self) -> str:
        """What these seeds can detect and what the paper's effect would need, in one sentence."""
        if math.isnan(self.min_detectable):
            if min(self.n_a, self.n_b if self.known_b is None else self.n_a) < MIN_PER_SIDE:
                return f"needs >= {MIN_PER_SIDE} {self.unit} per side to measure the noise"
            return "no spread between values to size the noise from"
        line = f"these {self.unit} detect effects of about {self.min_detectable:.3g} or more (80 % power, " \
               f"{self.test}, at the observed spread)"
        if self.unit != "seeds" or self.paper_effect is None:
            return line
        if self.seeds_needed is None:
            return f"{line}; the paper's effect ({self.paper_effect:.3g}) needs more than {MAX_SEEDS} seeds per side " \
                   "at this noise"
        return f"{line}; needs about {self.seeds_needed} seeds per side at this noise for the paper's effect " \
               f"({self.paper_effect:.3g})"

    def power_sentence(self) -> str:
        """What these seeds can say, for a report: "with 2 seeds a side, Welch's t-test has 80 % power only for
        differences of 0.094 or more (two-sided 5 % level, at the observed spread)"; the power line's reason when
        there is no spread to size it from."""
        if math.isnan(self.min_detectable):
            return self.power_line()
        if self.known_b is not None:
            counts = f"{self.n_a} {self.unit} against the known value {self.known_b:.3g}"
        elif self.test.startswith("the paired"):
            counts = f"{self.n_a} paired {self.unit}"
        elif self.n_a == self.n_b:
            counts = f"{self.n_a} {self.unit} a side"
        else:
            counts = f"{self.n_a} vs {self.n_b} {self.unit}"
        return detect_sentence(self.min_detectable, counts, self.test)

    def describe(self) -> str:
        """The report's sentence: estimate, interval, counts, method, verdict, reason and power."""
        interval = f"95% interval {self.low:+.3g} to {self.high:+.3g}" if not math.isnan(self.low) else "no interval"
        counts = f"{self.n_a} {self.unit} against the known value {self.known_b:.3g}" if self.known_b is not None \
            else f"{self.n_a} vs {self.n_b} {self.unit}"
        return f"{self.difference:+.3g} ({interval}; {counts}, {self.method}): {self.verdict} — {self.reason}; " \
               f"{self.power_line()}"

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ``paper_effect``, ``power_line`` and ``description``, JSON-ready."""
        return asdict(self) | {"paper_effect": self.paper_effect, "power_line": self.power_line(),
                               "power_sentence": self.power_sentence(), "description": self.describe()}


def judge(difference: float, low: float, high: float, *, sign: int, threshold: float | None) -> tuple[str, str]:
    """The rule (``vitscope.stats``) on an estimate and its interval: (verdict, reason). ``threshold`` None: the
    rule for a claim of direction only."""
    if any(math.isnan(v) for v in (difference, low, high)):
        return "inconclusive", "no interval"
    effect = sign * difference
    lo, hi = sorted((sign * low, sign * high))
    if threshold is None:
        if lo > 0:
            return "reproduced", "the interval excludes zero in the paper's direction"
        if hi <= 0:
            return "not reproduced", "the whole interval lies at or beyond zero, against the paper's direction"
        return "inconclusive", "the interval includes zero"
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


@dataclass(frozen=True)
class Precondition:
    """What a claim needs before its data can show the paper's effect at all: ``met`` or not, and ``reason``, in
    words, what was found (e.g. "no condition attends below uniform by 0.05 normalised MAD")."""

    met: bool
    reason: str


class Judged(Protocol):
    """Anything the rule has judged: a ``Comparison`` or an ``Equivalence``."""

    verdict: str
    reason: str


def verdict(result: Judged | tuple[str, str], precondition: Precondition | None = None) -> tuple[str, str]:
    """A claim's (verdict, reason): ``not testable`` with the precondition's reason when ``precondition`` is given
    and unmet, else the rule's own (``result``: a ``Comparison`` or an ``Equivalence``, or a (verdict, reason)
    pair from a study's aggregate of comparisons). ``not reproduced`` is kept for data that could show the effect
    and does not."""
    if precondition is not None and not precondition.met:
        return NOT_TESTABLE, precondition.reason
    return (result[0], result[1]) if isinstance(result, (tuple, list)) else (result.verdict, result.reason)


def _check_rule(sign: int, threshold: float | None) -> None:
    if sign not in (1, -1):
        raise ValueError(f"compare: sign={sign!r} must be +1 or -1 (the paper's direction)")
    if threshold is not None and not (threshold > 0 and math.isfinite(threshold)):
        raise ValueError(f"compare: threshold={threshold!r} must be a positive number (half the paper's effect), "
                         "or None for a claim of direction only")


def _power_test(est: Estimate) -> str:
    """The test whose power the spread sizes, in words."""
    if est.pooled:
        return "the pooled-variance t-test"
    if est.method.startswith(("paired", "cluster-robust t over images (paired)")):
        return "the paired t-test on image means" if est.unit == "images" else "the paired t-test"
    one_sample = est.sd_b == 0
    if est.unit == "images":
        return "the one-sample t-test on image means" if one_sample else "Welch's test on image means"
    return "the one-sample t-test" if one_sample else "Welch's t-test"


def power_of(est: Estimate, effect: float | None) -> tuple[float, int | None]:
    """(min_detectable, seeds_needed for ``effect``) of the test ``est`` is judged with, at its plug-in spread."""
    if math.isnan(est.sd_a):
        return math.nan, None
    if est.pooled:
        detect = pooled_min_detectable(est.sd_a, est.n_a, est.n_b)
    else:
        detect = min_detectable(est.sd_a, est.sd_b, est.n_a, est.n_b if est.sd_b > 0 else 0)
    if effect is None or est.unit != "seeds":
        return detect, None
    return detect, seeds_needed(effect, est.sd_a, est.sd_b)


def compare(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray | float, *, sign: int,
            threshold: float | None, paired: bool = False, clusters: Any = None) -> Comparison:
    """mean(a) - mean(b), its 95 % interval and the verdict of the one rule (``vitscope.stats``).

    ``a``, ``b``: per-seed values (every finite value used; NaN and inf dropped and counted in ``reason``), or
    per-unit values with ``clusters``: for unpaired values a pair ``(clusters_a, clusters_b)`` naming each unit's
    image, for paired values (or a known ``b``) one sequence. ``b`` one number (not a sequence): a value known
    exactly by construction (softmax's fraction of exact zeros is 0), not a sample: the one-sample t-interval of
    ``a`` against it, df n - 1. Values that merely happen to be equal are a sample: pass them as a sequence.
    ``paired``: ``a[i]`` and ``b[i]`` share a seed or an image. ``threshold``: half the paper's effect, or None for
    a claim of direction only.
    """
    _check_rule(sign, threshold)
    est = estimate(a, b, paired=paired, clusters=clusters)
    effect = None if threshold is None else 2.0 * threshold
    detect, needed = power_of(est, effect)
    common = {"sign": sign, "threshold": None if threshold is None else float(threshold), "unit": est.unit,
              "known_b": est.known_b, "test": _power_test(est) if not math.isnan(detect) else "",
              "limits": est.limits}
    if math.isnan(est.se) or est.problem and not est.pooled:
        decided, reason = "inconclusive", est.problem or "no interval"
        low = high = math.nan
    else:
        half = t_quantile((1 + LEVEL) / 2, est.df) * est.se
        low, high = est.difference - half, est.difference + half
        decided, reason = ("inconclusive", est.problem) if est.pooled else \
            judge(est.difference, low, high, sign=sign, threshold=threshold)
    reason = "; ".join([reason, *est.notes, *([est.limits] if est.limits else [])])
    return Comparison(float(est.difference), float(low), float(high), est.method, est.n_a, est.n_b, decided, reason,
                      min_detectable=float(detect), seeds_needed=needed, df=float(est.df), **common)
