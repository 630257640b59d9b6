"""Plain verdicts on the locality paper's claims (arXiv 2605.16390) from a study's comparisons.

Each claim's paper effect is stated once, in ``PAPER_CLAIMS``; the rule is ``vitscope.stats.compare``'s, the same
for every study. A comparison (``claims`` of ``results.`: with - without, one value per seed, every seed
used) is judged on the seeds: Welch's t-interval, and

* **reproduced**: the interval excludes zero in the paper's direction and the difference reaches half the paper's
  effect;
* **not reproduced**: the whole interval lies below half the paper's effect in the paper's direction;
* **inconclusive**: otherwise, and always with fewer than 2 seeds per side;
* **not testable**: the claim's precondition fails at the run's scale (``vitscope.stats.verdict``). A claim about
  locality (minimum early-layer MAD) needs some condition that attends measurably below uniform: its mean
  minimum early-layer MAD at least ``LOCAL_MARGIN`` below the uniform-attention value (0.4178 normalised on an
  8 x 8 grid; docs/definitions.md says why 0.05). Where every condition attends about uniformly, no locality
  effect can show, and "not reproduced" would be a finding the data cannot make.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitscope.stats import Precondition, compare, verdict
from vitscope.train.protocols import COMPONENTS

# normalised MAD below uniform attention that counts as measurably local: > 2x the farthest a uniformly attending
# run's minimum early-layer MAD fell below uniform in the CPU ablation (0.024, 16 runs), > 4x its seed-to-seed
# spread (sd <= 0.011 per condition), and a quarter of the paper's effect (0.2); docs/definitions.md
LOCAL_MARGIN = 0.05


@dataclass(frozen=True)
class PaperClaim:
    text: str
    effect: float  # the paper's difference, with - without
    unit: str

    @property
    def sign(self) -> int:
        return 1 if self.effect > 0 else -1

    @property
    def threshold(self) -> float:
        """Half the paper's effect, as a magnitude: the smallest difference that counts as reproducing it."""
        return abs(self.effect) / 2


PAPER_CLAIMS: dict[tuple[str, str], PaperClaim] = {
    ("cutmix", "min_early_mad"): PaperClaim(
        "CutMix makes early layers attend locally: minimum early-layer MAD falls by about 0.2 "
        "(paper: <= 0.024 with CutMix, >= 0.210 without)", -0.2, "normalised MAD"),
    ("cutmix", "accuracy"): PaperClaim("CutMix adds about 6-7 accuracy points", 0.065, "top-1"),
    ("autoaugment", "accuracy"): PaperClaim("AutoAugment adds about 6-7 accuracy points", 0.065, "top-1"),
}


def component_of(claim: dict[str, Any]) -> str | None:
    """The protocol component a comparison varies (from its name, as written by ``results.claims``)."""
    return next((c for c in COMPONENTS if c in claim["claim"]), None)


def locality_precondition(minima: dict[str, float], uniform: float, margin: float = LOCAL_MARGIN) -> Precondition:
    """Whether a locality effect can show: some condition's mean minimum early-layer MAD (``minima``, per
    condition, normalised) lies at least ``margin`` below ``uniform`` (uniform attention's MAD on the grid)."""
    finite = {c: v for c, v in minima.items() if v == v}
    if not finite:
        return Precondition(False, "no condition has a measured early-layer MAD")
    lowest = min(finite, key=finite.get)
    said = f"the lowest condition mean of minimum early-layer MAD is {finite[lowest]:.4f} ({lowest}) against " \
           f"{uniform:.4f} for uniform attention"
    if finite[lowest] <= uniform - margin:
        return Precondition(True, f"{said}: at least {margin:g} below uniform")
    return Precondition(False, f"every condition attends about uniformly in its early layers ({said}, less than "
                               f"{margin:g} below), so no locality effect can show at this scale")


def judge(claim: dict[str, Any]) -> dict[str, Any]:
    """``claim`` (with ``values_with`` and ``values_without``, one value per seed) with the comparison of
    ``vitscope.stats.compare`` added: ``difference``, ``ci95_low``/``ci95_high``, ``method``, ``verdict``,
    ``reason``, ``power``, and the paper's claim text, effect and threshold. A comparison the paper makes no claim
    about gets its interval and the verdict ``no paper claim``. A claim with ``precondition`` ({"met", "reason"},
    written by ``results.claims`` for MAD claims) that is unmet reads ``not testable`` with its reason."""
    paper = PAPER_CLAIMS.get((component_of(claim), claim["measure"]))
    a, b = claim["values_with"], claim["values_without"]
    result = compare(a, b, sign=paper.sign if paper else 1, threshold=paper.threshold if paper else 1.0)
    shown = {"difference": result.difference, "ci95_low": result.low, "ci95_high": result.high,
             "method": result.method, "runs_with": result.n_a, "runs_without": result.n_b}
    if paper is None:
        return claim | shown | {"verdict": "no paper claim", "reason": "", "power": "", "paper": None,
                                "expected": None, "threshold": None}
    given = claim.get("precondition")
    decided, reason = verdict(result, Precondition(bool(given["met"]), str(given["reason"])) if given else None)
    return claim | shown | {"verdict": decided, "reason": reason, "power": result.power_line(),
                            "min_detectable": result.min_detectable, "seeds_needed": result.seeds_needed,
                            "paper": paper.text, "expected": paper.effect, "threshold": paper.threshold,
                            "unit": paper.unit}


def distinct(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each comparison once: claims that compare the same runs on the same measure are merged, the first name
    kept and the others listed in ``same_as``."""
    kept: dict[tuple, dict[str, Any]] = {}
    for claim in claims:
        key = (claim["measure"], tuple(claim["conditions_with"]), tuple(claim["conditions_without"]))
        if key in kept:
            kept[key]["same_as"].append(claim["claim"])
        else:
            kept[key] = claim | {"same_as": []}
    return list(kept.values())
