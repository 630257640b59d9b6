"""Rows and summaries of a sparse-attention study, and its results files (pure numpy).

A record is one measured backbone (``vitscope.studies.sparse.measure``) with its condition and seed. The claims of
the paper are judged by ``vitscope.studies.sparse.judging`` (the registry's, each once); every condition's other
differences from softmax are shown without a verdict (``results_file.measured_differences``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitscope.atomic_io import write_csv, write_json
from vitscope.studies.sparse import values as V
from vitscope.studies.sparse.judging import judge_claims, run_scope
from vitscope.studies.sparse.results_file import SparseResults, measured_differences

LINEAR_GROUPS = {"dino-last4": "dino-last4", "last-cls": "cls"}  # the rows' group of each linear protocol


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) ignoring NaN."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def result_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat rows in the shared schema plus ``seed`` (and ``head`` for attention rows, numbered from 1)."""
    rows = []
    for r in records:
        base = {"model": r["condition"], "seed": r["seed"]}
        depth = r["depth"]
        for protocol, group in LINEAR_GROUPS.items():
            value = V.linear_top1(r, protocol)
            if value == value:
                rows.append(base | {"layer": depth, "layer_kind": "token", "group": group, "metric": "linear_top1",
                                    "value": value, "n": r["eval_images"]})
        rows.append(base | {"layer": depth, "layer_kind": "token", "group": "cls", "metric": "knn_top1",
                            "value": r["image"]["knn_top1"], "n": r["eval_images"]})
        for row in r["diffusion"]["rows"] + r.get("dense", []) + r.get("pib", []):
            model = row["model"].replace(r["label"], r["condition"], 1) if row["model"] != "chance" else "chance"
            rows.append({"model": model, "seed": r["seed"], **{k: v for k, v in row.items() if k != "model"}})
        for metric in ("zeros", "support", "mad", "entropy"):
            for li, heads in enumerate(r["attention"][metric]):
                for head, value in enumerate(heads):
                    rows.append(base | {"layer": li + 1, "layer_kind": "attention", "group": f"head{head + 1}",
                                        "metric": f"attention_{metric}", "value": value, "n": r["eval_images"]})
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (model, layer, layer_kind, group, with_cls, metric); per-head attention rows
    (``attention_*``) also averaged over heads (group ``heads``)."""
    keyed: dict[tuple, list[float]] = {}
    for row in rows:
        group = "heads" if row["metric"].startswith("attention_") else row.get("group")
        key = (row["model"], row.get("layer"), row.get("layer_kind"), group, row.get("with_cls"), row["metric"])
        keyed.setdefault(key + (row.get("seed"),), []).append(row["value"])
    per_seed: dict[tuple, list[float]] = {}
    for key, values in keyed.items():
        per_seed.setdefault(key[:-1], []).append(float(np.nanmean(np.asarray(values, dtype=float))))
    out = []
    for (model, layer, kind, group, with_cls, metric), values in per_seed.items():
        mean, std = mean_std(values)
        out.append({"model": model, "layer": layer, "layer_kind": kind, "group": group, "with_cls": with_cls,
                    "metric": metric, "mean": mean, "std": std, "seeds": len(values)})
    return out


def write_results(out: str | Path, settings: dict[str, Any], records: list[dict[str, Any]],
                  meta: dict[str, Any]) -> SparseResults:
    """results.json (``SparseResults``: settings, rows, the judged claims, runs, summary, measured differences,
    scope, provenance), results.csv and summary.csv; returns the results."""
    out = Path(out)
    rows = result_rows(records)
    summary = summarize(rows)
    runs = [{k: v for k, v in r.items() if k not in ("image", "diffusion", "attention")}
            | {"image": {k: v for k, v in r["image"].items() if not k.endswith("_correct")},
               "attention": r["attention"], "diffusion_last_layer": {
                   k: v for k, v in r["diffusion"]["last_layer"].items() if k not in ("hits", "cosines")}}
            for r in records]
    results = SparseResults(settings=settings, rows=rows, claims=judge_claims(records, settings),
                            provenance=meta, runs=runs, summary=summary, differences=measured_differences(records),
                            scope=run_scope(records, settings))
    write_json(out / "results.json", results.to_json())
    columns = ["model", "seed", "layer", "layer_kind", "group", "with_cls", "metric", "value", "n"]
    write_csv(out / "results.csv", [{c: r.get(c, "") for c in columns} for r in rows])
    write_csv(out / "summary.csv", summary)
    return results
