"""The locality paper's claims (``vitscope.claims.locality``) judged on a study's runs: each registry claim once,
by its own kind of test (``vitscope.claims.judge``), one value per seed.

- L1 (direction), L1-entropy (direction) and L2 (difference, 0.316 -> 0.008): Modern against Baseline, the
  headline pair, judged only under these claims;
- L4 (separation): every condition with CutMix against every one without, when the study has conditions beyond
  the Baseline/Modern pair on both sides;
- L5-autoaugment, L5-labelsmoothing (equivalence): Baseline + X against Baseline;
- L6-cutmix, L6-autoaugment (difference in top-1): Baseline + X against Baseline (not pooled over conditions);
- L3, L7, L8, L9: qualitative, shown with what vitscope offers.

Every MAD and entropy claim carries the locality precondition (``locality_precondition``): some condition's mean
minimum early-layer MAD lies ``LOCAL_MARGIN`` below uniform attention's MAD on the runs' own grid; without it no
locality effect can show and the claim reads "not testable". The verdict uses the stated reading
(``readings.stated``); the others the seed leaves open are judged the same way, each with its own precondition, into
``Judgement.readings``, and ``readings_note`` says in one sentence where they disagree.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vitscope.claims import Claim, Judgement, Reading, claims_of
from vitscope.claims.judge import judge, judge_separation, missing, not_judged, readings_note
from vitscope.metrics import uniform_mad
from vitscope.stats import Precondition, compare
from vitscope.studies.locality import readings as rd
from vitscope.studies.locality.records import LocalityRun, as_runs
from vitscope.studies.locality.scope import scope
from vitscope.train.protocols import parse_protocol

# normalised MAD below uniform attention that counts as measurably local: > 2x the farthest a uniformly attending
# run's minimum early-layer MAD fell below uniform in the CPU ablation (0.024, 16 runs), > 4x its seed-to-seed
# spread (sd <= 0.011 per condition), and about a quarter of the paper's CutMix gap (0.186); docs/definitions.md
LOCAL_MARGIN = 0.05
HEADLINE = ("baseline", "modern")  # the pair L1 and L2 compare


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


def grid_uniform(runs: list[LocalityRun]) -> float | None:
    """Uniform attention's normalised MAD on the one grid every run was measured on (None when unknown or mixed)."""
    grids = {tuple(r.grid_size) if r.grid_size else None for r in runs}
    if len(grids) != 1 or None in grids:
        return None
    return uniform_mad(grids.pop())


def by_condition(runs: list[LocalityRun]) -> dict[str, list[LocalityRun]]:
    """The runs of each condition, in the order they first appear."""
    found: dict[str, list[LocalityRun]] = {}
    for r in runs:
        found.setdefault(r.condition, []).append(r)
    return found


def has_cutmix(condition: str) -> bool:
    return "cutmix" in parse_protocol(condition)


def precondition(runs: list[LocalityRun], reading: rd.Reading) -> Precondition | None:
    """The locality precondition under ``reading`` (each condition's mean over seeds of its minimum early-layer
    MAD against the grid's uniform value); None when the runs' grid is unknown."""
    uniform = grid_uniform(runs)
    if uniform is None:
        return None
    minima = {c: float(np.nanmean([rd.min_early_mad(r, reading) for r in rs])) for c, rs in by_condition(runs).items()}
    return locality_precondition(minima, uniform)


def _value(measure: str) -> Callable[[LocalityRun, rd.Reading], float]:
    if measure == "min_early_mad":
        return rd.min_early_mad
    if measure == "early_entropy":
        return rd.early_entropy
    return lambda run, reading: float("nan") if run.accuracy is None else float(run.accuracy)


def _reading(name: str, judged: Judgement) -> Reading:
    return Reading(name, judged.difference, judged.ci95_low, judged.ci95_high, judged.verdict, judged.reason)


def _with_readings(judged: Judgement, main: rd.Reading, alternatives: list[rd.Reading],
                   judge_one: Callable[[rd.Reading], Judgement], note: str) -> Judgement:
    judged.readings = [_reading(alt.name(main), judge_one(alt)) for alt in alternatives]
    judged.readings_note = readings_note(judged)
    judged.details = {**judged.details, "reading": {"mad": rd.MAD_READINGS[main.mad], "early": main.layers_text},
                      **({"unread": note} if note else {})}
    return judged


def _pair(claim: Claim, runs: list[LocalityRun], main: rd.Reading, alternatives: list[rd.Reading],
          where: str) -> Judgement:
    """A difference, direction or equivalence claim: condition ``claim.a`` against ``claim.b``."""
    groups = by_condition(runs)
    if claim.a not in groups or claim.b not in groups:
        return missing(claim, f"needs runs of {claim.a} and {claim.b}; this study has {', '.join(groups)}",
                       scope=where)
    value = _value(claim.measure)
    if claim.measure == "accuracy":
        if any(r.accuracy is None for r in groups[claim.a] + groups[claim.b]):
            return missing(claim, "top-1 was not measured (the model has no head for the dataset's classes)",
                           scope=where)
        return judge(claim, [value(r, main) for r in groups[claim.a]], [value(r, main) for r in groups[claim.b]],
                     scope=where)

    def judge_one(reading: rd.Reading) -> Judgement:
        # entropy is measured on renormalised rows only: its precondition is the stated MAD's at the same layers
        needs = reading if claim.measure == "min_early_mad" else rd.Reading(rd.STATED_MAD, reading.early, "")
        return judge(claim, [value(r, reading) for r in groups[claim.a]],
                     [value(r, reading) for r in groups[claim.b]], precondition=precondition(runs, needs),
                     scope=where)

    if claim.measure != "min_early_mad":
        alternatives = [alt for alt in alternatives if alt.mad == rd.STATED_MAD]
    return _with_readings(judge_one(main), main, alternatives, judge_one,
                          rd.unread(runs) if claim.measure == "min_early_mad" else "")


def _separation(claim: Claim, runs: list[LocalityRun], main: rd.Reading, alternatives: list[rd.Reading],
                where: str) -> Judgement:
    """L4: every condition with CutMix against every one without."""
    groups = by_condition(runs)
    with_, without = ([c for c in groups if has_cutmix(c) == side] for side in (True, False))
    if not with_ or not without:
        return missing(claim, f"needs conditions with and without CutMix; this study has {', '.join(groups)}",
                       scope=where)
    if set(groups) <= set(HEADLINE):
        return missing(claim, "with Baseline and Modern alone the one pair is the headline comparison, judged under "
                              "L1 and L2; the separation needs the ablation's other conditions (--conditions "
                              "ablation, or e.g. baseline,baseline+cutmix)", scope=where)

    def judge_one(reading: rd.Reading) -> Judgement:
        values = {c: [rd.min_early_mad(r, reading) for r in groups[c]] for c in groups}
        judged = judge_separation(claim, {c: values[c] for c in with_}, {c: values[c] for c in without},
                                  precondition=precondition(runs, reading), scope=where)
        closest = min(judged.details["pairs"], key=lambda p: p["difference"] if p["difference"] == p["difference"]
                      else -np.inf)  # as judge_separation picks it
        judged.power = compare(values[closest["b"]], values[closest["a"]], sign=1,
                               threshold=claim.test.paper_size / 2).power_line() + " (the closest pair)"
        return judged

    return _with_readings(judge_one(main), main, alternatives, judge_one, rd.unread(runs))


def judge_runs(runs: list[LocalityRun] | list[dict], *, dataset: str,
               early_layers: list[int] | None = None) -> list[Judgement]:
    """Every claim of the locality registry, in its order, judged once on ``runs`` (one value per seed);
    ``dataset`` names the data for each verdict's scope; ``early_layers`` (0-based) the stated early layers
    (default: the first quarter)."""
    runs = as_runs(runs)
    out = []
    for claim in claims_of("locality"):
        if not claim.judged:
            out.append(not_judged(claim))
        elif not runs:
            out.append(missing(claim, "no run was measured"))
        else:
            main = rd.stated(runs[0].num_layers, early_layers)
            alternatives = rd.others(runs, early_layers)
            where = scope(claim, runs, dataset)
            judge_claim = _separation if claim.test.kind == "separation" else _pair
            out.append(judge_claim(claim, runs, main, alternatives, where))
    return out
