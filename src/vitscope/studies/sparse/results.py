"""Rows, summaries and claim verdicts of a sparse-attention study, from per-run records (pure numpy).

A record is one measured backbone (``vitscope.studies.sparse.measure``) with its condition and seed. Claims
compare each condition with ``softmax`` on one value per seed, every seed of both sides used: the difference
(condition - softmax), its 95 % interval and the verdict of the one rule (``vitscope.stats.compare``: Welch's
t-interval over seeds; reproduced when it excludes zero in the paper's direction and the difference reaches half
the claim's effect, not reproduced when it lies wholly below half the effect, inconclusive otherwise and always
with fewer than 2 seeds per side; not testable when a side has no measured value: ``measured``, the claim's
precondition through ``vitscope.stats.verdict``). Each claim's effect is stated once, in
``presets.CLAIM_EFFECTS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitscope.atomic_io import write_csv, write_json
from vitscope.stats import Precondition, compare, verdict
from vitscope.studies.sparse.presets import claim_effect

BASELINE = "softmax"
# measure -> (what it is, predicted sign for a sparse normaliser against softmax: +1 higher, -1 lower)
CLAIMS = {
    "linear_top1": ("image linear-probe top-1 (last layer CLS)", +1),
    "knn_top1": ("image kNN top-1 (last layer CLS)", +1),
    "diffusion_top1": ("semantic diffusion: class top-1 from one background token (last layer)", -1),
    "diffusion_cosine": ("semantic diffusion: background-patch/CLS cosine (last layer)", -1),
    "attention_zeros": ("fraction of exact zeros in attention (mean over layers and heads)", +1),
}


def dense_value(record: dict[str, Any], measure: str) -> float:
    """``seg:NAME`` (mIoU) or ``depth:NAME`` (RMSE) at the last layer without CLS; NaN when not measured."""
    metric = "miou" if measure.startswith("seg:") else "rmse"
    found = [r["value"] for r in record.get("dense", []) if r["group"] == measure and r["metric"] == metric
             and r.get("with_cls") is False and r["layer"] == record["depth"]]
    return float(found[0]) if found else float("nan")


def dense_claims(records: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Claim measures for the dense sets present: higher mIoU and lower RMSE predicted for sparse attention."""
    groups = sorted({r["group"] for rec in records for r in rec.get("dense", [])})
    return {g: (f"{'segmentation mIoU' if g.startswith('seg:') else 'depth RMSE'} on {g.split(':', 1)[1]} "
                "(last layer, patches only)", +1 if g.startswith("seg:") else -1) for g in groups}


def run_value(record: dict[str, Any], measure: str) -> float:
    """One run's value of a claim's measure (NaN when missing)."""
    if measure.startswith(("seg:", "depth:")):
        return dense_value(record, measure)
    if measure in ("linear_top1", "knn_top1"):
        return float(record["image"][measure])
    if measure == "diffusion_top1":
        value = record["diffusion"]["last_layer"].get("top1")
    elif measure == "diffusion_cosine":
        value = record["diffusion"]["last_layer"].get("cosine")
    else:
        value = float(np.nanmean(np.asarray(record["attention"]["zeros"], dtype=float)))
    return float("nan") if value is None else float(value)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) ignoring NaN."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def measured(condition: str, values: list[float], baseline_values: list[float], measure: str) -> Precondition:
    """A claim's precondition here: both sides have at least one measured (finite) value of ``measure``."""
    missing = [name for name, vals in ((condition, values), (BASELINE, baseline_values))
               if not np.isfinite(np.asarray(vals, dtype=float)).any()]
    if missing:
        return Precondition(False, f"{measure} was not measured in the {' and '.join(missing)} runs")
    return Precondition(True, f"{measure} measured on both sides")


def claims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every condition against softmax on every claim measure, over seeds, with its interval, verdict, power line
    and a sentence in plain words. Conditions without a sparse normaliser (registers only) are shown with their
    interval but not judged (verdict 'no claim')."""
    by_condition = _by_condition(records)
    if BASELINE not in by_condition:
        return []
    base = by_condition[BASELINE]
    out = []
    for condition, runs in by_condition.items():
        if condition == BASELINE:
            continue
        sparse = (runs[0].get("normaliser") or condition.split("+")[0]) != BASELINE
        for measure, (what, predicted) in (CLAIMS | dense_claims(records)).items():
            effect, source = claim_effect(measure)
            values, baseline_values = [run_value(r, measure) for r in runs], [run_value(r, measure) for r in base]
            result = compare(values, baseline_values, sign=predicted, threshold=effect / 2)
            sign = predicted if sparse else None
            decided, reason = verdict(result, measured(condition, values, baseline_values, measure))
            out.append({"condition": condition, "baseline": BASELINE, "measure": measure, "what": what,
                        "value": mean_std(values)[0], "baseline_value": mean_std(baseline_values)[0],
                        "values": values, "baseline_values": baseline_values, "difference": result.difference,
                        "ci95_low": result.low, "ci95_high": result.high, "method": result.method,
                        "paper_effect": predicted * effect, "effect_source": source, "threshold": effect / 2,
                        "predicted": {1: "higher", -1: "lower", None: "none"}[sign],
                        "verdict": decided if sparse else "no claim",
                        "reason": reason if sparse else "the paper predicts nothing for registers alone",
                        "power": result.power_line() if sparse else "", "runs": result.n_a,
                        "baseline_runs": result.n_b, "sentence": _sentence(condition, what, result, sign)})
    return out


def _sentence(condition: str, what: str, result: Any, sign: int | None) -> str:
    direction = "higher" if result.difference > 0 else "lower"
    interval = f"95% interval {result.low:+.3g} to {result.high:+.3g}" if result.low == result.low else "no interval"
    said = f"{condition} vs softmax, {what}: {direction} by {abs(result.difference):.3g} ({interval}; " \
           f"{result.n_a} vs {result.n_b} seeds, {result.method})"
    if sign is None:
        return f"{said}; the paper makes no prediction for registers, so this is shown, not judged."
    expected = "higher" if sign > 0 else "lower"
    return f"{said}; the paper's direction is {expected} by {result.paper_effect:.3g}: {result.verdict} " \
           f"({result.reason}); {result.power_line()}."


def _by_condition(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        out.setdefault(record["condition"], []).append(record)
    return out


def result_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat rows in the shared schema plus ``seed`` (and ``head`` for attention rows, numbered from 1)."""
    rows = []
    for r in records:
        base = {"model": r["condition"], "seed": r["seed"]}
        depth = r["depth"]
        for metric in ("linear_top1", "knn_top1"):
            rows.append(base | {"layer": depth, "layer_kind": "token", "group": "cls", "metric": metric,
                                "value": r["image"][metric], "n": r["eval_images"]})
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


def write_results(out: str | Path, kind: str, settings: dict[str, Any], records: list[dict[str, Any]],
                  meta: dict[str, Any]) -> dict[str, Any]:
    """results.json ({schema_version, kind, settings, rows, provenance} plus runs, summary and claims),
    results.csv and summary.csv; returns the payload."""
    out = Path(out)
    rows = result_rows(records)
    summary = summarize(rows)
    runs = [{k: v for k, v in r.items() if k not in ("image", "diffusion", "attention")}
            | {"image": {k: v for k, v in r["image"].items() if not k.endswith("_correct")},
               "attention": r["attention"], "diffusion_last_layer": {
                   k: v for k, v in r["diffusion"]["last_layer"].items() if k not in ("hits", "cosines")}}
            for r in records]
    payload = {"schema_version": meta.get("schema_version", 1), "kind": kind, "settings": settings, "rows": rows,
               "summary": summary, "claims": claims(records), "runs": runs, "provenance": meta}
    write_json(out / "results.json", payload)
    columns = ["model", "seed", "layer", "layer_kind", "group", "with_cls", "metric", "value", "n"]
    write_csv(out / "results.csv", [{c: r.get(c, "") for c in columns} for r in rows])
    write_csv(out / "summary.csv", summary)
    return payload
