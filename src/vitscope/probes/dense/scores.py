"""A dense probe's scores from its heads' per-image outcomes: the result rows (mean over head seeds, each seed
beside it), each score's 95 % interval, and the best layer.

Per-image outcomes are kept by (backbone, layer, with_cls): segmentation confusion counts (seeds, images, C, C),
depth errors {metric: (seeds, images)} with each image's count of scored pixels. A segmentation score is
computed from the confusion summed over images (dataset-level), per seed, then averaged over seeds; a depth score
is the mean over images per seed (the pooled RMSE over pixels), then averaged over seeds. Intervals are
``vitscope.probes.dense.intervals``'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vitscope.metrics.dense import segmentation_scores
from vitscope.probes.dense.intervals import DenseInterval, mean_difference, miou_difference
from vitscope.probes.results import ProbeResult, row

Key = tuple[str, int, bool]  # (backbone label, layer, with_cls)
SEGMENT_METRICS = ("miou", "pixel_accuracy")
DEPTH_MAIN = ("rmse", "rmse_pooled", "abs_rel", "delta1")
LOWER_IS_BETTER = {"rmse", "rmse_pooled", "abs_rel"}


@dataclass
class DenseProbeResult(ProbeResult):
    """A ``ProbeResult`` that also holds each head's per-image outcomes in memory (``per_image``, by (backbone,
    layer, with_cls); not written), so that a caller can compare any two heads scored on the same images
    (``vitscope.probes.dense.intervals``)."""

    per_image: dict[Key, Any] = field(default_factory=dict, repr=False)
    task: str = "segmentation"

    def interval(self, a: Key, b: Key | None = None, metric: str | None = None, blocks: int | None = None
                 ) -> DenseInterval:
        """Head a's score (``metric``: miou by default, rmse for depth), or a minus b, with its interval."""
        metric = metric or ("miou" if self.task == "segmentation" else "rmse")
        if self.task == "segmentation":
            return miou_difference(self.per_image[a], None if b is None else self.per_image[b], blocks=blocks,
                                   metric=metric)
        values = self.per_image[a][0][metric]
        return mean_difference(values, None if b is None else self.per_image[b][0][metric], blocks=blocks,
                               what=metric if b is None else f"{metric} difference")


def segment_rows(name: str, layer: int, with_cls: bool, confusions: Tensor, classes: Sequence[str]
                 ) -> list[dict[str, Any]]:
    """Rows of one segmentation head from its (seeds, images, C, C) confusions: miou and pixel accuracy (mean over
    seeds; each seed as group 'seed N' when there are several) and each class's IoU (mean over seeds)."""
    images = confusions.shape[1]
    common = {"model": name, "layer": layer, "layer_kind": "token", "with_cls": with_cls, "n": images}
    per_seed = [segmentation_scores(c.sum(0)) for c in confusions]
    out = [row(**common, metric=metric, value=_mean([s[metric] for s in per_seed])) for metric in SEGMENT_METRICS]
    if len(per_seed) > 1:
        out += [row(**common, group=f"seed {s}", metric=metric, value=scores[metric])
                for s, scores in enumerate(per_seed) for metric in SEGMENT_METRICS]
    ious = torch.tensor([s["iou"] for s in per_seed], dtype=torch.float64)
    out += [row(**common, group=cls, metric="iou", value=float(ious[:, c].nanmean()) if not ious[:, c].isnan().all()
                else math.nan) for c, cls in enumerate(classes)]
    return out


def depth_rows(name: str, layer: int, with_cls: bool, values: dict[str, Tensor], counts: Tensor
               ) -> list[dict[str, Any]]:
    """Rows of one depth head from its per-image errors {metric: (seeds, images)} and scored pixels (images,)."""
    common = {"model": name, "layer": layer, "layer_kind": "token", "with_cls": with_cls, "n": values["rmse"].shape[1]}
    per_seed = [depth_summary({m: v[s] for m, v in values.items()}, counts) for s in range(values["rmse"].shape[0])]
    out = [row(**common, metric=metric, value=_mean([s[metric] for s in per_seed])) for metric in DEPTH_MAIN]
    if len(per_seed) > 1:
        out += [row(**common, group=f"seed {s}", metric=metric, value=scores[metric])
                for s, scores in enumerate(per_seed) for metric in DEPTH_MAIN]
    return out


def depth_summary(values: dict[str, Tensor], counts: Tensor) -> dict[str, float]:
    """``depth_scores``' numbers from per-image errors (images,): means over images with a scored pixel, and the
    RMSE pooled over pixels."""
    keep = counts > 0
    pooled = float(((values["rmse"][keep].double() ** 2 * counts[keep]).sum() / counts[keep].sum()).sqrt())
    return {"rmse": float(values["rmse"][keep].mean()), "rmse_pooled": pooled,
            "abs_rel": float(values["abs_rel"][keep].mean()), "delta1": float(values["delta1"][keep].mean())}


def score_intervals(result: DenseProbeResult, blocks: int | None = None) -> list[dict[str, Any]]:
    """Every head's main score with its 95 % interval over images (and seeds), as dicts for ``settings``."""
    metric = "miou" if result.task == "segmentation" else "rmse"
    out = []
    for key in sorted(result.per_image):
        found = result.interval(key, blocks=blocks)
        out.append({"model": key[0], "layer": key[1], "with_cls": key[2], "metric": metric,
                    "value": found.difference, "ci95_low": found.low, "ci95_high": found.high,
                    "per_seed": found.per_seed, "method": found.method})
    return out


def best_layer(rows: Sequence[dict[str, Any]], model: str, metric: str) -> dict[str, Any] | None:
    """The layer (and CLS setting) with the best main score of ``model``, with that score."""
    candidates = [r for r in rows if r["model"] == model and r["metric"] == metric and "group" not in r
                  and not math.isnan(r["value"])]
    if not candidates:
        return None
    pick = (min if metric in LOWER_IS_BETTER else max)(candidates, key=lambda r: r["value"])
    return {"layer": pick["layer"], "with_cls": pick.get("with_cls"), "metric": metric, "value": pick["value"]}


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
