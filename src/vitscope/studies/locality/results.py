"""Summaries and claim checks of a locality study, from per-run records (pure numpy).

A record is one trained run: its condition, seed, accuracy and (layers, heads) MAD and entropy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitscope.metrics import early_layers as metrics_early_layers
from vitscope.studies.locality.verdicts import judge
from vitscope.train.protocols import COMPONENTS, parse_protocol, protocol_name

PAPER = {  # arXiv 2605.16390, CIFAR-100, vit-compact
    "cutmix_min_early_mad": "every condition with CutMix <= 0.024, every one without >= 0.210 "
                            "(Baseline 0.316 vs Modern 0.008)",
    "accuracy": "CutMix and AutoAugment each add about 6-7 accuracy points",
}


def early_heads(record: dict[str, Any], early_layers: list[int] | None) -> np.ndarray:
    """The MAD of every head in the early layers of one run, flattened (NaN heads dropped)."""
    mad = np.asarray(record["mad"], dtype=float)
    values = mad[metrics_early_layers(len(mad), early_layers)].ravel()
    return values[~np.isnan(values)]


def min_early_mad(record: dict[str, Any], early_layers: list[int] | None = None) -> float:
    values = early_heads(record, early_layers)
    return float(values.min()) if values.size else float("nan")


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(np.nanmean(arr)), float(np.nanstd(arr, ddof=1)) if arr.size > 1 else 0.0


def summarize(records: list[dict[str, Any]], early_layers: list[int] | None = None) -> list[dict[str, Any]]:
    """One row per condition: accuracy, minimum early-layer MAD, per-layer mean MAD and entropy; mean and
    standard deviation over seeds (std 0 for a single seed)."""
    rows = []
    for condition in dict.fromkeys(r["condition"] for r in records):
        runs = [r for r in records if r["condition"] == condition]
        row: dict[str, Any] = {"condition": condition, "seeds": len(runs)}
        row["accuracy_mean"], row["accuracy_std"] = _mean_std([r["accuracy"] for r in runs])
        row["min_early_mad_mean"], row["min_early_mad_std"] = _mean_std([min_early_mad(r, early_layers) for r in runs])
        for metric in ("mad", "entropy"):
            per_run = np.asarray([np.nanmean(np.asarray(r[metric], dtype=float), axis=1) for r in runs])
            for layer in range(per_run.shape[1]):
                row[f"{metric}_layer{layer + 1}_mean"], row[f"{metric}_layer{layer + 1}_std"] = _mean_std(
                    per_run[:, layer].tolist())
        rows.append(row)
    return rows


def _compare(name: str, measure: str, with_runs, without_runs, early_layers) -> dict[str, Any] | None:
    """One comparison, with - without, judged on one value per seed (each run's own accuracy or minimum
    early-layer MAD) by ``verdicts.judge``."""
    if not with_runs or not without_runs:
        return None
    if measure == "accuracy" and any(r["accuracy"] is None for r in with_runs + without_runs):
        return None
    if measure == "min_early_mad":
        values_with = [min_early_mad(r, early_layers) for r in with_runs]
        values_without = [min_early_mad(r, early_layers) for r in without_runs]
    else:
        values_with = [float(r["accuracy"]) for r in with_runs]
        values_without = [float(r["accuracy"]) for r in without_runs]
    return judge({"claim": name, "measure": measure, "with": float(np.nanmean(values_with)),
                  "without": float(np.nanmean(values_without)), "values_with": values_with,
                  "values_without": values_without,
                  "conditions_with": sorted({r["condition"] for r in with_runs}),
                  "conditions_without": sorted({r["condition"] for r in without_runs})})


def claims(records: list[dict[str, Any]], early_layers: list[int] | None = None) -> list[dict[str, Any]]:
    """Checks of the paper's claims that the conditions present allow, each over seeds with its 95% interval and
    verdict (``vitscope.stats.compare``, through ``verdicts.judge``)."""
    comps = {r["condition"]: parse_protocol(r["condition"]) for r in records}
    out = []
    for component in COMPONENTS:
        has = [r for r in records if component in comps[r["condition"]]]
        lacks = [r for r in records if component not in comps[r["condition"]]]
        alone = [r for r in records if r["condition"] == protocol_name(frozenset({component}))]
        base = [r for r in records if r["condition"] == "baseline"]
        for measure in ("min_early_mad", "accuracy"):
            out.append(_compare(f"conditions with {component} vs without", measure, has, lacks, early_layers))
            out.append(_compare(f"baseline+{component} vs baseline ({component} alone)", measure, alone, base,
                                early_layers))
    return [c for c in out if c is not None]
