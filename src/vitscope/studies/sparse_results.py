"""Rows, summaries and claim verdicts of a sparse-attention study, from per-run records (pure numpy).

A record is one measured backbone (``vitscope.studies.sparse_measure``) with its condition and seed. Claims
compare each condition with ``softmax``: the difference (condition - softmax), a 95 % bootstrap interval
(over seeds when both sides have at least two, else paired over the same evaluation images, tokens or heads)
and a verdict against an effect-size threshold ``t`` in the direction the paper predicts:

* reproduced: the interval excludes zero on the predicted side and the difference is at least ``t``;
* not reproduced: the interval lies on the wrong side of zero, or below ``t`` on the predicted side (no effect
  of the claimed size);
* inconclusive at this scale: anything else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitscope.files import write_csv, write_json
from vitscope.studies.sparse_presets import THRESHOLDS

BOOTSTRAP_SAMPLES = 2000
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


def units(record: dict[str, Any], measure: str) -> np.ndarray:
    """The bootstrap units of one run: per-image correctness, per-token hits, per-image cosines or per-head
    zero fractions (1-D, NaN where undefined)."""
    if measure.startswith(("seg:", "depth:")):
        return np.asarray([], dtype=float)  # one confusion matrix / pooled score per run: no per-image units
    if measure == "linear_top1":
        return np.asarray(record["image"]["linear_correct"], dtype=float)
    if measure == "knn_top1":
        return np.asarray(record["image"]["knn_correct"], dtype=float)
    last = record["diffusion"]["last_layer"]
    if measure == "diffusion_top1":
        return np.asarray(last.get("hits") or [], dtype=float)
    if measure == "diffusion_cosine":
        return np.asarray(last.get("cosines") or [], dtype=float)
    return np.asarray(record["attention"]["zeros"], dtype=float).ravel()


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) ignoring NaN."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def bootstrap_difference(a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]], measure: str,
                         seed: int = 0) -> tuple[float, float, str]:
    """95 % interval of mean(a) - mean(b): over seeds when both sides have two or more runs, else paired over
    the units of the two first runs (same images), or unpaired when their unit counts differ."""
    rng = np.random.default_rng(seed)
    if len(a_runs) > 1 and len(b_runs) > 1:
        a = np.asarray([run_value(r, measure) for r in a_runs])
        b = np.asarray([run_value(r, measure) for r in b_runs])
        diffs = (a[rng.integers(0, len(a), (BOOTSTRAP_SAMPLES, len(a)))].mean(1)
                 - b[rng.integers(0, len(b), (BOOTSTRAP_SAMPLES, len(b)))].mean(1))
        over = "seeds"
    else:
        a, b = units(a_runs[0], measure), units(b_runs[0], measure)
        if measure != "attention_zeros" and a.shape == b.shape and a.size:
            keep = ~(np.isnan(a) | np.isnan(b))
            delta = (a - b)[keep]
            diffs = delta[rng.integers(0, delta.size, (BOOTSTRAP_SAMPLES, delta.size))].mean(1)
            over = {"diffusion_top1": "background tokens (paired)", "diffusion_cosine": "images (paired)"}.get(
                measure, "images (paired)")
        else:
            a, b = a[~np.isnan(a)], b[~np.isnan(b)]
            if not a.size or not b.size:
                return float("nan"), float("nan"), "nothing (one run per side, no per-image units: use several seeds)"
            diffs = (a[rng.integers(0, a.size, (BOOTSTRAP_SAMPLES, a.size))].mean(1)
                     - b[rng.integers(0, b.size, (BOOTSTRAP_SAMPLES, b.size))].mean(1))
            over = "heads" if measure == "attention_zeros" else "units (unpaired)"
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high), over


def verdict(difference: float, low: float, high: float, sign: int | None, threshold: float) -> str:
    """reproduced / not reproduced / inconclusive at this scale (module docstring), or 'no claim'."""
    if sign is None:
        return "no claim"
    if any(np.isnan(v) for v in (difference, low, high)):
        return "inconclusive at this scale"
    d, lo, hi = sign * difference, *sorted((sign * low, sign * high))
    if lo > 0 and d >= threshold:
        return "reproduced"
    if hi < 0 or hi < threshold:
        return "not reproduced"
    return "inconclusive at this scale"


def claims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every condition against softmax on every claim measure, with its interval and verdict in plain words."""
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
            a, b = mean_std([run_value(r, measure) for r in runs])[0], mean_std([run_value(r, measure)
                                                                                  for r in base])[0]
            difference = a - b
            low, high, over = bootstrap_difference(runs, base, measure)
            sign = predicted if sparse else None
            threshold = THRESHOLDS[measure.split(":")[0] if ":" in measure else measure]
            result = verdict(difference, low, high, sign, threshold)
            out.append({"condition": condition, "baseline": BASELINE, "measure": measure, "what": what,
                        "value": a, "baseline_value": b, "difference": difference, "ci95_low": low,
                        "ci95_high": high, "interval_over": over, "threshold": threshold,
                        "predicted": {1: "higher", -1: "lower", None: "none"}[sign], "verdict": result,
                        "runs": len(runs), "baseline_runs": len(base),
                        "sentence": _sentence(condition, what, difference, low, high, over, sign, threshold,
                                              result)})
    return out


def _sentence(condition: str, what: str, difference: float, low: float, high: float, over: str,
              sign: int | None, threshold: float, result: str) -> str:
    direction = "higher" if difference > 0 else "lower"
    interval = f"95% interval {low:+.3f} to {high:+.3f}, bootstrap over {over}" if low == low else \
        "no interval: one run per side and no per-image units; use several seeds"
    said = f"{condition} vs softmax, {what}: {direction} by {abs(difference):.3f} ({interval})"
    if sign is None:
        return f"{said}; the paper makes no prediction for registers, so this is shown, not judged."
    expected = "higher" if sign > 0 else "lower"
    return f"{said}; the paper predicts {expected} with sparse attention; with an effect-size threshold of " \
           f"{threshold:g}: {result}."


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
