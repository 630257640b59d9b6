"""Plain verdicts on the locality paper's claims (arXiv 2605.16390) from a study's comparisons.

Each claim the paper makes has an expected effect and an effect-size threshold, half the paper's effect: a
difference smaller than that is not a finding, whatever its interval. A comparison (``claims`` of
``locality_results``: with - without, 95% bootstrap interval) is judged:

* **reproduced**: the difference goes the paper's way by at least the threshold and its interval excludes zero;
* **not reproduced**: the whole interval stays short of the threshold in the paper's direction (no effect of
  the paper's size, or one the other way);
* **inconclusive**: otherwise (the interval reaches both sides of the threshold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitscope.train.protocols import COMPONENTS


@dataclass(frozen=True)
class PaperClaim:
    text: str
    expected: float  # the paper's difference, with - without
    threshold: float  # smallest difference (in the paper's direction) that counts as reproducing it
    unit: str


PAPER_CLAIMS: dict[tuple[str, str], PaperClaim] = {
    ("cutmix", "min_early_mad"): PaperClaim(
        "CutMix makes early layers attend locally: minimum early-layer MAD falls by about 0.2 "
        "(paper: <= 0.024 with CutMix, >= 0.210 without)", -0.2, 0.1, "normalised MAD"),
    ("cutmix", "accuracy"): PaperClaim("CutMix adds about 6-7 accuracy points", 0.065, 0.03, "top-1"),
    ("autoaugment", "accuracy"): PaperClaim("AutoAugment adds about 6-7 accuracy points", 0.065, 0.03, "top-1"),
}


def component_of(claim: dict[str, Any]) -> str | None:
    """The protocol component a comparison varies (from its name, as written by ``locality_results.claims``)."""
    return next((c for c in COMPONENTS if c in claim["claim"]), None)


def judge(claim: dict[str, Any]) -> dict[str, Any]:
    """``claim`` with ``verdict`` (reproduced / not reproduced / inconclusive / no paper claim), the paper's
    claim text, expected effect and threshold added."""
    paper = PAPER_CLAIMS.get((component_of(claim), claim["measure"]))
    if paper is None:
        return claim | {"verdict": "no paper claim", "paper": None, "expected": None, "threshold": None}
    sign = 1.0 if paper.expected > 0 else -1.0
    effect = sign * claim["difference"]
    low, high = sorted((sign * claim["ci95_low"], sign * claim["ci95_high"]))
    if effect >= paper.threshold and low > 0:
        verdict = "reproduced"
    elif high < paper.threshold:
        verdict = "not reproduced"
    else:
        verdict = "inconclusive"
    return claim | {"verdict": verdict, "paper": paper.text, "expected": paper.expected,
                    "threshold": paper.threshold, "unit": paper.unit}


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
