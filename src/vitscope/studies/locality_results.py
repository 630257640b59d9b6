"""Summaries and claim checks of a locality study, from per-run records (pure numpy).

A record is one trained run: its condition, seed, accuracy and (layers, heads) MAD and entropy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitscope.metrics import early_layers as metrics_early_layers
from vitscope.train.protocols import COMPONENTS, parse_protocol, protocol_name

BOOTSTRAP_SAMPLES = 2000
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


def _bootstrap_min_mad(runs: list[dict[str, Any]], early_layers, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap distribution (B,) of the mean over runs of the minimum early-layer MAD, resampling runs
    (seeds) and, within each run, its early heads."""
    per_run = []
    for run in runs:
        heads = early_heads(run, early_layers)
        picks = rng.integers(0, heads.size, size=(BOOTSTRAP_SAMPLES, heads.size))
        per_run.append(heads[picks].min(axis=1))
    per_run = np.stack(per_run, axis=1)  # (B, runs)
    choice = rng.integers(0, len(runs), size=(BOOTSTRAP_SAMPLES, len(runs)))
    return np.take_along_axis(per_run, choice, axis=1).mean(axis=1)


def _bootstrap_accuracy(runs: list[dict[str, Any]], rng: np.random.Generator) -> np.ndarray:
    acc = np.asarray([r["accuracy"] for r in runs], dtype=float)
    return acc[rng.integers(0, len(acc), size=(BOOTSTRAP_SAMPLES, len(acc)))].mean(axis=1)


def _compare(name: str, measure: str, with_runs, without_runs, early_layers, seed: int) -> dict[str, Any] | None:
    if not with_runs or not without_runs:
        return None
    if measure == "accuracy" and any(r["accuracy"] is None for r in with_runs + without_runs):
        return None
    rng = np.random.default_rng(seed)
    if measure == "min_early_mad":
        a = _bootstrap_min_mad(with_runs, early_layers, rng)
        b = _bootstrap_min_mad(without_runs, early_layers, rng)
        point_a = np.mean([min_early_mad(r, early_layers) for r in with_runs])
        point_b = np.mean([min_early_mad(r, early_layers) for r in without_runs])
    else:
        a, b = _bootstrap_accuracy(with_runs, rng), _bootstrap_accuracy(without_runs, rng)
        point_a = np.mean([r["accuracy"] for r in with_runs])
        point_b = np.mean([r["accuracy"] for r in without_runs])
    low, high = np.percentile(a - b, [2.5, 97.5])
    return {"claim": name, "measure": measure, "with": float(point_a), "without": float(point_b),
            "difference": float(point_a - point_b), "ci95_low": float(low), "ci95_high": float(high),
            "runs_with": len(with_runs), "runs_without": len(without_runs),
            "conditions_with": sorted({r["condition"] for r in with_runs}),
            "conditions_without": sorted({r["condition"] for r in without_runs}),
            "interval_excludes_zero": bool(low > 0 or high < 0)}


def claims(records: list[dict[str, Any]], early_layers: list[int] | None = None) -> list[dict[str, Any]]:
    """Checks of the paper's claims that the conditions present allow, each with a 95% bootstrap interval."""
    comps = {r["condition"]: parse_protocol(r["condition"]) for r in records}
    out = []
    for component in COMPONENTS:
        has = [r for r in records if component in comps[r["condition"]]]
        lacks = [r for r in records if component not in comps[r["condition"]]]
        alone = [r for r in records if r["condition"] == protocol_name(frozenset({component}))]
        base = [r for r in records if r["condition"] == "baseline"]
        for measure in ("min_early_mad", "accuracy"):
            out.append(_compare(f"conditions with {component} vs without", measure, has, lacks, early_layers, 1))
            out.append(_compare(f"baseline+{component} vs baseline ({component} alone)", measure, alone, base,
                                early_layers, 2))
    return [c for c in out if c is not None]
