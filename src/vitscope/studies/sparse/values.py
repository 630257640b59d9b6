"""What one measured run of the sparse study gives for each quantity the claims and comparisons read (pure).

A record is one measured backbone (``vitscope.studies.sparse.measure``) with its condition and seed. Every reader
returns NaN when the run did not measure the quantity, so that a claim with no value on a side is 'not testable'.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

Record = dict[str, Any]
OLD_PROTOCOL = "last-cls"  # records written before the study's linear protocol was recorded used the last CLS


def linear_top1(record: Record, protocol: str | None = None) -> float:
    """Linear-probe top-1 under ``protocol`` (``dino-last4`` or ``last-cls``; None: the study's own)."""
    image = record["image"]
    own = image.get("linear_protocol", OLD_PROTOCOL)
    if protocol is None or protocol == own:
        return float(image["linear_top1"])
    value = image.get(f"linear_top1_{protocol}")
    return math.nan if value is None else float(value)


def dense_value(record: Record, group: str, *, with_cls: bool = False, layer: int | None = None) -> float:
    """``group`` (``seg:NAME`` mIoU in points, ``depth:NAME`` RMSE in the set's units) at ``layer`` (default: the
    last), with or without the CLS token concatenated; NaN when not measured."""
    metric = "miou" if group.startswith("seg:") else "rmse"
    layer = record["depth"] if layer is None else layer
    found = [r["value"] for r in record.get("dense", []) if r.get("group") == group and r["metric"] == metric
             and bool(r.get("with_cls")) is with_cls and r["layer"] == layer]
    return float(found[0]) if found else math.nan


def dense_groups(records: list[Record], kind: str) -> list[str]:
    """The dense sets measured (``seg:NAME`` or ``depth:NAME`` for ``kind`` 'seg' or 'depth'), first measured
    first (the study probes its first segmentation set layer by layer)."""
    seen: dict[str, None] = {}
    for record in records:
        for row in record.get("dense", []):
            if str(row.get("group", "")).startswith(f"{kind}:"):
                seen.setdefault(row["group"], None)
    return list(seen)


def zeros(record: Record) -> float:
    """The fraction of exactly zero attention probabilities (patch queries and keys), mean over layers and heads."""
    return float(np.nanmean(np.asarray(record["attention"]["zeros"], dtype=float)))


def diffusion(record: Record, which: str) -> float:
    """Semantic diffusion at the last layer: ``top1`` (class from one background token) or ``cosine``."""
    last = record.get("diffusion", {}).get("last_layer") or record.get("diffusion_last_layer") or {}
    value = last.get(which)
    return math.nan if value is None else float(value)


# What each compared measure is, read from a record; the comparisons table shows every one (no paper claim).
MEASURES = {
    "linear_top1": ("image linear-probe top-1 (the study's protocol)", linear_top1),
    "knn_top1": ("image kNN top-1 (last layer CLS)", lambda r: float(r["image"]["knn_top1"])),
    "diffusion_top1": ("vitscope's semantic diffusion (a): class top-1 from one background token (last layer)",
                       lambda r: diffusion(r, "top1")),
    "diffusion_cosine": ("vitscope's semantic diffusion (b): background-patch/CLS cosine (last layer)",
                         lambda r: diffusion(r, "cosine")),
    "attention_zeros": ("fraction of exact zeros in attention (mean over layers and heads)", zeros),
}


def measure_value(record: Record, measure: str) -> float:
    """One run's value of a compared measure: a ``MEASURES`` name, ``seg:NAME`` (last layer, patches only) or
    ``depth:NAME`` (last layer, CLS concatenated, as the seed's depth protocol)."""
    if measure.startswith("seg:"):
        return dense_value(record, measure)
    if measure.startswith("depth:"):
        return dense_value(record, measure, with_cls=True)
    return MEASURES[measure][1](record)


def measure_words(measure: str) -> str:
    """What a compared measure is, in words."""
    if measure.startswith("seg:"):
        return f"segmentation mIoU on {measure[4:]} (last layer, patches only)"
    if measure.startswith("depth:"):
        return f"depth RMSE on {measure[6:]} (last layer, CLS concatenated)"
    return MEASURES[measure][0]


def by_condition(records: list[Record]) -> dict[str, list[Record]]:
    """Records grouped by condition, in first-seen order."""
    out: dict[str, list[Record]] = {}
    for record in records:
        out.setdefault(record["condition"], []).append(record)
    return out
