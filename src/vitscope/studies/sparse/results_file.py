"""The sparse study's ``results.json`` as a typed object, written by the study and read, by attribute, by its
report, the index page and the benchmarks.

``SparseResults`` adds to ``StudyResults`` (``study``, ``settings``, ``rows``, ``claims`` as Judgements,
``provenance``): ``runs`` (one measured backbone each), ``summary`` (mean and std over seeds), ``differences``
(every condition against softmax on every measure, with its interval and no verdict: what no paper claim covers,
vitscope's own diffusion measures among them) and ``scope`` (this run beside the paper's setting). Files written
before the claims registry (schema 1, claims as per-condition dicts) are read too: their verdicts become
Judgements without a claim id, and their unjudged rows differences.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vitscope.claims import Judgement
from vitscope.stats import compare
from vitscope.studies.sparse import values as V
from vitscope.studies.sparse.conditions import BASELINE
from vitscope.studies.study_results import StudyResults

_OLD_VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable")


@dataclass
class MeasuredDifference:
    """``condition`` - softmax on ``measure`` over seeds: the means, the values, the difference with its 95 %
    interval by the one rule's estimate (``vitscope.stats.compare``) and no verdict: no paper claim is judged here."""

    condition: str
    measure: str
    what: str
    value: float
    baseline_value: float
    difference: float
    ci95_low: float
    ci95_high: float
    method: str
    n: int
    n_baseline: int
    baseline: str = BASELINE
    values: list[float] = field(default_factory=list)
    baseline_values: list[float] = field(default_factory=list)


def measured_differences(records: list[V.Record]) -> list[MeasuredDifference]:
    """Every condition against softmax on every compared measure (``values.MEASURES``, each segmentation set with
    patches only and each depth set with CLS, at the last layer); softmax's fraction of exact zeros is its known
    value 0, not a sample."""
    groups = V.by_condition(records)
    if BASELINE not in groups:
        return []
    measures = list(V.MEASURES) + V.dense_groups(records, "seg") + V.dense_groups(records, "depth")
    out = []
    for condition, runs in groups.items():
        if condition == BASELINE:
            continue
        for measure in measures:
            a = [V.measure_value(r, measure) for r in runs]
            b = [V.measure_value(r, measure) for r in groups[BASELINE]]
            if not any(math.isfinite(v) for v in a) or not any(math.isfinite(v) for v in b):
                continue
            # softmax's exact zeros are 0 by construction: a known value, not a sample
            known = measure == "attention_zeros" and all(v == 0.0 for v in b)
            result = compare(a, 0.0 if known else b, sign=1, threshold=None)
            out.append(MeasuredDifference(condition, measure, V.measure_words(measure), _mean(a), _mean(b),
                                          result.difference, result.low, result.high, result.method, result.n_a,
                                          result.n_b, values=a, baseline_values=b))
    return out


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


@dataclass
class SparseResults(StudyResults):
    """The sparse study's results (module docstring). ``SCHEMA_VERSION`` 2: claims are registry Judgements."""

    SCHEMA_VERSION: ClassVar[int] = 2
    KIND: ClassVar[str] = "sparse-study"

    study: str = "sparse"
    runs: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    differences: list[MeasuredDifference] = field(default_factory=list)
    scope: str = ""

    def __post_init__(self) -> None:
        legacy = [c for c in self.claims if isinstance(c, dict) and "claim_id" not in c]
        if legacy:
            self.claims = [_legacy_judgement(c) for c in legacy if c.get("verdict") in _OLD_VERDICTS]
            self.differences = self.differences or [_legacy_difference(c) for c in legacy if "measure" in c]
        super().__post_init__()
        self.differences = [d if isinstance(d, MeasuredDifference) else MeasuredDifference(**_known(d))
                            for d in self.differences]

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["differences"] = [dataclasses.asdict(d) for d in self.differences]
        return data

    @classmethod
    def coerce(cls, results: SparseResults | dict[str, Any]) -> SparseResults:
        """``results`` as SparseResults (a results file's dict read with ``from_json``)."""
        return results if isinstance(results, SparseResults) else cls.from_json(results)

    def conditions(self) -> list[str]:
        """The conditions and given models measured, in run order."""
        return list(dict.fromkeys(r["condition"] for r in self.runs))

    def seeds_per_condition(self) -> int:
        """The fewest seeds any condition has."""
        return min((len({r["seed"] for r in self.runs if r["condition"] == c}) for c in self.conditions()),
                   default=0)


def _known(data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(MeasuredDifference)}
    return {k: v for k, v in data.items() if k in names}


def _legacy_judgement(old: dict[str, Any]) -> Judgement:
    """A claim row of a results file written before the registry, as a Judgement without a claim id."""
    statement = f"{old.get('condition')} vs {BASELINE}: {old.get('what') or old.get('measure')}"
    return Judgement("", "sparse", statement, "difference", old["verdict"], str(old.get("reason", "")),
                     measure=str(old.get("measure", "")), a=str(old.get("condition", "")), b=BASELINE,
                     difference=old.get("difference"), ci95_low=old.get("ci95_low"), ci95_high=old.get("ci95_high"),
                     method=str(old.get("method", "")), n_a=int(old.get("runs") or 0),
                     n_b=int(old.get("baseline_runs") or 0), power=str(old.get("power", "")),
                     paper_effect=old.get("paper_effect"),
                     scope="written before the claims registry: judged against vitscope's own effects, not the "
                           "registry's; rerun the study to judge the paper's claims")


def _legacy_difference(old: dict[str, Any]) -> MeasuredDifference:
    nan = math.nan
    return MeasuredDifference(
        str(old.get("condition")), str(old["measure"]), str(old.get("what") or old["measure"]),
        _number(old.get("value")), _number(old.get("baseline_value")), _number(old.get("difference")),
        _number(old.get("ci95_low", nan)), _number(old.get("ci95_high", nan)), str(old.get("method", "")),
        int(old.get("runs") or 0), int(old.get("baseline_runs") or 0), values=list(old.get("values") or []),
        baseline_values=list(old.get("baseline_values") or []))


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)
