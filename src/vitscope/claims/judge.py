"""Judging a registry claim on evidence, by its kind of test (``vitscope.claims.registry``), with the one rule of
every study (``vitscope.stats``).

- ``judge``: a difference, a direction or an equivalence between two sets of values (one per seed, or per unit
  with image clusters), optionally under other readings of what the seed leaves open;
- ``judge_separation``: a separation between two groups of conditions, every (a, b) pair compared;
- ``judge_census``: whether models of a kind have the thing at all (a census, not a statistic over seeds);
- ``not_judged``: a qualitative claim, shown with what vitscope offers for it.

Every verdict says how large the measured effect is beside the paper's (``size_words``) and what model, data and
sample it holds for (``scope``, given by the caller).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from vitscope.claims.judgement import NOT_JUDGED, Judgement, Reading
from vitscope.claims.registry import Claim
from vitscope.stats import NOT_TESTABLE, Precondition, compare, equivalence, verdict
from vitscope.stats import judge as rule

Values = Sequence[float]


def size_words(difference: float | None, claim: Claim) -> str:
    """The measured effect beside the paper's, in words: 'about 25 times the paper's effect (+0.142 against
    +0.0056)', 'the opposite sign to the paper's ...'; for a claim without a size, what the paper gives."""
    test = claim.test
    if difference is None or math.isnan(difference):
        return ""
    if test.kind == "equivalence":
        inside = "within" if abs(difference) < test.margin else "beyond"
        return f"{inside} the equivalence margin of ±{test.margin:g} {test.unit}".rstrip()
    paper = test.effect if test.kind == "difference" else None
    if paper is None:
        return "the paper gives a direction, not a size"
    ratio = difference / paper
    against = f"({difference:+.3g} against the paper's {paper:+.3g} {test.unit})".replace(" )", ")")
    if ratio <= 0:
        return f"the opposite sign to the paper's effect {against}"
    if ratio < 0.9:
        return f"about {ratio:.0%} of the paper's effect {against}"
    if ratio <= 1.1:
        return f"about the paper's effect {against}"
    return f"about {ratio:.2g} times the paper's effect {against}"


def _rule(claim: Claim, a: Values, b: Values | float, **options: Any):
    """The stats result of ``claim``'s kind on a against b."""
    test = claim.test
    if test.kind == "equivalence":
        return equivalence(a, b, test.margin, **options)
    if test.kind == "difference":
        return compare(a, b, sign=test.direction, threshold=abs(test.effect) / 2, **options)
    if test.kind == "direction":
        return compare(a, b, sign=test.direction, threshold=None, **options)
    raise ValueError(f"claim {claim.id} is a {test.kind} claim; judge it with judge_{test.kind}")


def _interval(result: Any) -> tuple[float, float]:
    return float(result.low), float(result.high)


def judge(claim: Claim, a: Values, b: Values | float, *, paired: bool = False, clusters: Any = None,
          precondition: Precondition | None = None, scope: str = "", a_label: str | None = None,
          b_label: str | None = None, layer: int | None = None, rows: list[dict[str, Any]] | None = None,
          readings: Mapping[str, tuple[Values, Values | float]] | None = None,
          unit: str = "seeds") -> Judgement:
    """``claim`` (a difference, direction or equivalence) judged on ``a`` - ``b``: ``a`` one value per seed (per
    unit with ``clusters``), ``b`` likewise or a float, a known constant (a side that is the same by construction,
    e.g. softmax's 0 exact zeros). ``precondition``: unmet, the verdict is 'not testable' with its reason.
    ``readings``: {name: (a, b)} of the same claim under other readings the seed leaves open; ``scope``: the model,
    data and sample the verdict holds for."""
    options: dict[str, Any] = {"paired": paired}
    if clusters is not None:
        options["clusters"] = clusters
    result = _rule(claim, a, b, **options)
    decided, reason = verdict(result, precondition)
    low, high = _interval(result)
    judgement = Judgement(
        claim.id, claim.study, claim.statement, claim.test.kind, decided, reason, measure=claim.measure,
        a=a_label or claim.a, b=b_label or claim.b, difference=float(result.difference), ci95_low=low,
        ci95_high=high, method=result.method, n_a=result.n_a, n_b=result.n_b, unit=unit,
        power=result.power_line() if hasattr(result, "power_line") else "", paper=claim.paper.describe(),
        paper_effect=claim.test.effect, size=size_words(float(result.difference), claim), scope=scope, layer=layer,
        family=claim.family, details=_details(result), values_a=_floats(a), values_b=_floats(b), rows=rows or [])
    if readings:
        judgement.readings = [_reading(claim, name, ra, rb, options, precondition)
                              for name, (ra, rb) in readings.items()]
        judgement.readings_note = readings_note(judgement)
    return judgement


def _reading(claim: Claim, name: str, a: Values, b: Values | float, options: dict[str, Any],
             precondition: Precondition | None) -> Reading:
    result = _rule(claim, a, b, **options)
    decided, reason = verdict(result, precondition)
    low, high = _interval(result)
    return Reading(name, float(result.difference), low, high, decided, reason)


def readings_note(judgement: Judgement) -> str:
    """One sentence when another reading of the seed gives another verdict; '' when every reading agrees."""
    other = [r for r in judgement.readings if r.verdict != judgement.verdict]
    if not other:
        return ""
    said = "; ".join(f"with {r.name} it reads {r.verdict} ({r.difference:+.3g}, interval {r.ci95_low:+.3g} to "
                     f"{r.ci95_high:+.3g})" for r in other)
    return f"The readings the seed leaves open disagree: {said}."


def judge_separation(claim: Claim, groups_a: Mapping[str, Values], groups_b: Mapping[str, Values], *,
                     precondition: Precondition | None = None, scope: str = "") -> Judgement:
    """A separation claim on conditions: ``groups_a`` (expected low, at most the paper's ``upper``) and
    ``groups_b`` (expected high, at least ``lower``), one value per seed per condition. Every (a, b) pair is
    compared (b - a) by the one rule with half the paper's gap as the bar; reproduced when every pair is,
    not reproduced when some pair's whole interval lies below the bar, inconclusive otherwise. Whether the paper's
    absolute bounds hold (they depend on its unstated MAD reading) is reported beside, not judged."""
    test = claim.test
    if not groups_a or not groups_b:
        return missing(claim, f"needs conditions on both sides ({claim.a}: {len(groups_a)}, {claim.b}: "
                              f"{len(groups_b)})", scope=scope)
    pairs = []
    for name_a, values_a in groups_a.items():
        for name_b, values_b in groups_b.items():
            result = compare(values_b, values_a, sign=1, threshold=test.paper_size / 2)
            pairs.append({"a": name_a, "b": name_b, "difference": result.difference, "ci95_low": result.low,
                          "ci95_high": result.high, "verdict": result.verdict, "method": result.method})
    weakest = min(pairs, key=lambda p: p["difference"] if not math.isnan(p["difference"]) else -math.inf)
    verdicts = {p["verdict"] for p in pairs}
    if verdicts == {"reproduced"}:
        decided = ("reproduced", f"every one of the {len(pairs)} pairs separates by at least half the paper's gap "
                                 f"({test.paper_size / 2:.3g}); the closest is {weakest['b']} - {weakest['a']}")
    elif "not reproduced" in verdicts:
        failed = [p for p in pairs if p["verdict"] == "not reproduced"]
        decided = ("not reproduced", f"{len(failed)} of {len(pairs)} pairs lie wholly below half the paper's gap "
                                     f"({test.paper_size / 2:.3g}), e.g. {failed[0]['b']} - {failed[0]['a']}")
    else:
        decided = ("inconclusive", f"no pair fails, but not every pair separates clearly; the closest is "
                                   f"{weakest['b']} - {weakest['a']}")
    decided = verdict(decided, precondition)
    means_a = {k: _mean(v) for k, v in groups_a.items()}
    means_b = {k: _mean(v) for k, v in groups_b.items()}
    bounds = {"upper": test.upper, "lower": test.lower,
              "a_within_upper": all(v <= test.upper for v in means_a.values()),
              "b_within_lower": all(v >= test.lower for v in means_b.values()),
              "means_a": means_a, "means_b": means_b}
    gap = weakest["difference"]
    return Judgement(
        claim.id, claim.study, claim.statement, "separation", decided[0], decided[1], measure=claim.measure,
        a=claim.a, b=claim.b, difference=-gap, ci95_low=-weakest["ci95_high"], ci95_high=-weakest["ci95_low"],
        method=f"closest pair of {len(pairs)}, {weakest['method']}", n_a=len(groups_a), n_b=len(groups_b),
        unit="conditions", paper=claim.paper.describe(), paper_effect=-test.paper_size,
        size=_gap_words(gap, test.paper_size, test.unit), scope=scope, family=claim.family,
        details={"pairs": pairs, "bounds": bounds})


def _gap_words(gap: float, paper_gap: float, unit: str) -> str:
    if math.isnan(gap):
        return ""
    if gap <= 0:
        return f"the groups overlap (closest gap {gap:+.3g} against the paper's {paper_gap:.3g} {unit})"
    return f"the closest gap is {gap / paper_gap:.0%} of the paper's ({gap:.3g} against {paper_gap:.3g} {unit})"


def judge_census(claim: Claim, models: Mapping[str, bool], *, scope: str = "",
                 details: dict[str, Any] | None = None) -> Judgement:
    """A census claim: ``models`` maps each model (or run) of the claim's kind to whether it has the thing (a
    separate high-norm mode, exact zeros). ``expect=True``: reproduced when at least one has it (with ``every``:
    each one), not reproduced when none does (with ``every``: when any lacks it); ``expect=False``: reproduced when
    none has it, not reproduced when any does. No model: not testable."""
    if not models:
        return missing(claim, f"no model of this kind ({claim.a}) was measured", scope=scope)
    having = sorted(name for name, has in models.items() if has)
    lacking = sorted(name for name, has in models.items() if not has)
    found = f"{len(having)} of {len(models)} have it" + (f" ({', '.join(having)})" if having else "")
    if claim.test.expect and claim.test.every:
        decided = "not reproduced" if lacking else "reproduced"
    elif claim.test.expect:
        decided = "reproduced" if having else "not reproduced"
    else:
        decided = "not reproduced" if having else "reproduced"
    return Judgement(claim.id, claim.study, claim.statement, "census", decided, f"{found}; without: "
                     f"{', '.join(lacking) or 'none'}", measure=claim.measure, a=claim.a, n_a=len(models),
                     unit="models", paper=claim.paper.describe(), scope=scope, family=claim.family,
                     details={"models": dict(models), **(details or {})})


def not_judged(claim: Claim, offered: str = "") -> Judgement:
    """A qualitative claim (a figure, a hypothesis, a scope statement): shown with what vitscope offers for it."""
    return Judgement(claim.id, claim.study, claim.statement, claim.test.kind, NOT_JUDGED,
                     offered or claim.vitscope or "a qualitative claim; no statistic judges it",
                     measure=claim.measure, a=claim.a, b=claim.b, paper=claim.paper.describe(), family=claim.family)


def missing(claim: Claim, why: str, *, scope: str = "", layer: int | None = None) -> Judgement:
    """'not testable' for a claim this run cannot judge (its conditions or tokens are absent), saying why."""
    return Judgement(claim.id, claim.study, claim.statement, claim.test.kind, NOT_TESTABLE, why,
                     measure=claim.measure, a=claim.a, b=claim.b, paper=claim.paper.describe(), scope=scope,
                     layer=layer, family=claim.family)


def _details(result: Any) -> dict[str, Any]:
    """What an equivalence result adds (its one-sided p-values and margin); nothing for a comparison."""
    keep = ("p_lower", "p_upper", "margin", "low95", "high95", "df")
    return {k: getattr(result, k) for k in keep if hasattr(result, k)}


def _floats(values: Values | float) -> list[float]:
    if isinstance(values, int | float):
        return [float(values)]
    return [float(v) for v in values]


def _mean(values: Values) -> float:
    finite = [float(v) for v in values if not math.isnan(float(v))]
    return sum(finite) / len(finite) if finite else math.nan


def judge_estimate(claim: Claim, difference: float, low: float, high: float, *, method: str, n_a: int,
                   n_b: int = 0, unit: str = "images", sign: int | None = None, scope: str = "",
                   layer: int | None = None, rows: list[dict[str, Any]] | None = None, a_label: str | None = None,
                   b_label: str | None = None, measure: str | None = None, precondition: Precondition | None = None,
                   details: dict[str, Any] | None = None) -> Judgement:
    """A difference or direction claim judged by the one rule (``vitscope.stats.judge``) on an estimate whose 95 %
    interval was built elsewhere: a dataset-level score such as mIoU, whose interval over images is a jackknife
    (``vitscope.probes.dense.intervals``), not a mean over units. ``sign``: the paper's direction on this measure
    when it differs from the claim's (-1 where lower is better, e.g. depth RMSE for 'helps depth')."""
    test = claim.test
    if test.kind not in ("difference", "direction"):
        raise ValueError(f"claim {claim.id} is a {test.kind} claim; judge_estimate judges a difference or a direction")
    direction = sign if sign is not None else test.direction
    threshold = abs(test.effect) / 2 if test.kind == "difference" else None
    decided, reason = verdict(rule(difference, low, high, sign=direction, threshold=threshold), precondition)
    return Judgement(
        claim.id, claim.study, claim.statement, test.kind, decided, reason, measure=measure or claim.measure,
        a=a_label or claim.a, b=b_label or claim.b, difference=float(difference), ci95_low=float(low),
        ci95_high=float(high), method=method, n_a=n_a, n_b=n_b, unit=unit, paper=claim.paper.describe(),
        paper_effect=test.effect, size=size_words(float(difference) * direction * test.direction, claim),
        scope=scope, layer=layer, family=claim.family, details=details or {}, rows=rows or [])
