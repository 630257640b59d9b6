"""A locality study's results as a typed object (``LocalityResults``, its ``results.json``) and the per-condition
summary (pure numpy).

``LocalityResults`` is what the study writes and what the report, the index page and the benchmarks read by
attribute: ``runs`` (``LocalityRun``), ``summary`` (one row per condition), ``rows`` (one per condition, seed,
layer and head), ``claims`` (the registry's claims as ``Judgement``s), ``settings`` and ``provenance``. Files
written before the claims registry (schema 1: claims as per-component comparisons, no ``settings``) are read too:
their claims are judged again from their runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vitscope.studies.locality import readings as rd
from vitscope.studies.locality.records import LocalityRun, as_runs
from vitscope.studies.locality.verdicts import judge_runs
from vitscope.studies.study_results import StudyResults


def _mean_std(values: list[float | None]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(np.nanmean(arr)), float(np.nanstd(arr, ddof=1)) if arr.size > 1 else 0.0


def summarize(runs: list[LocalityRun] | list[dict], early_layers: list[int] | None = None) -> list[dict[str, Any]]:
    """One row per condition: accuracy, minimum early-layer MAD (the stated reading, and with CLS counted at
    distance 0 where recorded), mean early-layer entropy, per-layer mean MAD and entropy; mean and standard
    deviation over seeds (std 0 for a single seed)."""
    runs = as_runs(runs)
    with_cls0 = bool(runs) and all(r.mad_cls_at_zero for r in runs)  # one set of columns for every row
    rows = []
    for condition in dict.fromkeys(r.condition for r in runs):
        mine = [r for r in runs if r.condition == condition]
        main = rd.stated(mine[0].num_layers, early_layers)
        row: dict[str, Any] = {"condition": condition, "seeds": len(mine)}
        row["accuracy_mean"], row["accuracy_std"] = _mean_std([r.accuracy for r in mine])
        row["min_early_mad_mean"], row["min_early_mad_std"] = _mean_std([rd.min_early_mad(r, main) for r in mine])
        if with_cls0:
            cls0 = rd.Reading("mad_cls_at_zero", main.early, main.early_words)
            row["min_early_mad_cls_at_zero_mean"], row["min_early_mad_cls_at_zero_std"] = _mean_std(
                [rd.min_early_mad(r, cls0) for r in mine])
        row["early_entropy_mean"], row["early_entropy_std"] = _mean_std([rd.early_entropy(r, main) for r in mine])
        for metric in ("mad", "entropy"):
            per_run = np.asarray([np.nanmean(np.asarray(r.measure(metric), dtype=float), axis=1) for r in mine])
            for layer in range(per_run.shape[1]):
                row[f"{metric}_layer{layer + 1}_mean"], row[f"{metric}_layer{layer + 1}_std"] = _mean_std(
                    per_run[:, layer].tolist())
        rows.append(row)
    return rows


def head_rows(runs: list[LocalityRun]) -> list[dict[str, Any]]:
    """One row per (condition, seed, layer, head), layers and heads numbered from 1."""
    with_cls0 = bool(runs) and all(r.mad_cls_at_zero for r in runs)  # one set of columns for every row
    rows = []
    for r in runs:
        for li, layer in enumerate(r.layers):
            for head in range(len(r.mad[li])):
                row = {"condition": r.condition, "seed": r.seed, "layer": layer + 1, "head": head + 1,
                       "mad": r.mad[li][head]}
                if with_cls0:
                    row["mad_cls_at_zero"] = r.mad_cls_at_zero[li][head]
                rows.append(row | {"entropy": r.entropy[li][head], "accuracy": r.accuracy})
    return rows


@dataclass
class LocalityResults(StudyResults):
    """A locality study's results (``StudyResults`` plus ``runs`` and ``summary``)."""

    SCHEMA_VERSION: ClassVar[int] = 2  # 2: claims as registry Judgements, settings, MAD with CLS at distance 0
    KIND: ClassVar[str] = "locality-study"

    study: str = "locality"
    runs: list[LocalityRun] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.runs = as_runs(self.runs)

    @property
    def dataset(self) -> str:
        return str(self.provenance.get("dataset") or self.settings.get("dataset") or "")

    @property
    def early_layers(self) -> list[int] | None:
        """The early layers the study named (0-based), None for the first quarter."""
        return self.settings.get("early_layers")

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {"runs": [r.to_json() for r in self.runs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LocalityResults:
        """Results from their file's dict; a file written before the registry gets its claims judged again from its
        runs, and its settings from its provenance. A file without runs is refused in one line."""
        data = dict(data)
        if not data.get("runs"):
            raise ValueError("these locality results hold no runs; a study writes results.json after measuring its "
                             "runs (vitscope study locality)")
        legacy = any("claim_id" not in c for c in data.get("claims") or [])
        if legacy:
            data["claims"] = []
        if not data.get("settings"):
            data["settings"] = dict((data.get("provenance") or {}).get("config") or {})
        results = super().from_json(data)
        if legacy or not results.claims:
            results.claims = judge_runs(results.runs, dataset=results.dataset, early_layers=results.early_layers)
        return results


def read_results(source: dict[str, Any] | LocalityResults) -> LocalityResults:
    """``LocalityResults`` from a results file's dict (or as given)."""
    return source if isinstance(source, LocalityResults) else LocalityResults.from_json(source)
