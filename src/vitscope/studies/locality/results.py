"""Summaries and claim checks of a locality study, from per-run records (pure numpy).

A record is one trained run: its condition, seed, accuracy and (layers, heads) MAD and entropy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitscope.metrics import early_layers as metrics_early_layers
from vitscope.metrics import uniform_mad
from vitscope.studies.locality.verdicts import distinct, judge, locality_precondition
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


def precondition(records: list[dict[str, Any]], early_layers: list[int] | None = None) -> dict[str, Any] | None:
    """Whether these runs can show a locality effect (``verdicts.locality_precondition``, on each condition's mean
    minimum early-layer MAD over seeds) as {"met", "reason", "uniform"}; None without the runs' grid size."""
    grids = {tuple(r["grid_size"]) for r in records if r.get("grid_size")}
    if len(grids) != 1 or any(not r.get("grid_size") for r in records):
        return None
    uniform = uniform_mad(grids.pop())
    minima = {c: float(np.nanmean([min_early_mad(r, early_layers) for r in records if r["condition"] == c]))
              for c in dict.fromkeys(r["condition"] for r in records)}
    found = locality_precondition(minima, uniform)
    return {"met": found.met, "reason": found.reason, "uniform": uniform}


def _compare(name: str, measure: str, with_runs, without_runs, early_layers,
             needs: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """One comparison, with - without, judged on one value per seed (each run's own accuracy or minimum
    early-layer MAD) by ``verdicts.judge``; a MAD comparison carries the runs' precondition ``needs``."""
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
                  "conditions_without": sorted({r["condition"] for r in without_runs})}
                 | ({"precondition": needs} if needs is not None and measure == "min_early_mad" else {}))


def claims(records: list[dict[str, Any]], early_layers: list[int] | None = None) -> list[dict[str, Any]]:
    """Checks of the paper's claims that the conditions present allow, each over seeds with its 95% interval and
    verdict (``vitscope.stats.compare``, through ``verdicts.judge``); MAD claims are ``not testable`` when no
    condition attends measurably below uniform (``precondition``)."""
    needs = precondition(records, early_layers)
    comps = {r["condition"]: parse_protocol(r["condition"]) for r in records}
    out = []
    for component in COMPONENTS:
        has = [r for r in records if component in comps[r["condition"]]]
        lacks = [r for r in records if component not in comps[r["condition"]]]
        alone = [r for r in records if r["condition"] == protocol_name(frozenset({component}))]
        base = [r for r in records if r["condition"] == "baseline"]
        for measure in ("min_early_mad", "accuracy"):
            out.append(_compare(f"conditions with {component} vs without", measure, has, lacks, early_layers, needs))
            out.append(_compare(f"baseline+{component} vs baseline ({component} alone)", measure, alone, base,
                                early_layers, needs))
    return [c for c in out if c is not None]


def judged_claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each distinct comparison of a study's ``results`` judged again; a MAD claim from a file written before the
    precondition was stored gets it from the file's runs (so an old file's uniform runs read not testable too)."""
    runs = results.get("runs") or []
    early = (results.get("provenance", {}).get("config") or {}).get("early_layers")
    needs = precondition(runs, early) if runs and all("mad" in r for r in runs) else None
    return [judge(c if "precondition" in c or needs is None or c["measure"] != "min_early_mad"
                  else c | {"precondition": needs}) for c in distinct(results["claims"])]
