"""Dense-prediction metrics: segmentation from one confusion matrix, depth errors per image and pooled.

Segmentation (as mmseg): one confusion matrix over every evaluated pixel of the split, ignore-index pixels left
out; IoU_c = TP / (TP + FP + FN); classes absent from both prediction and label (TP + FP + FN = 0) are NaN and
left out of the mean; pixel accuracy = trace / total.

Depth, as the toolbox behind DINOv2's depth numbers: valid pixels have finite ground truth with
``min_depth`` < gt <= ``max_depth`` (1e-3 and 10 m by default; NYU's range), optionally inside the Eigen crop;
``rmse``, ``abs_rel`` (mean |pred - gt| / gt) and ``delta1`` (fraction with max(pred / gt, gt / pred) < 1.25) of
each image, then their mean over images; ``rmse_pooled`` is the RMSE over every valid pixel of the split.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int | None = None) -> Tensor:
    """(num_classes, num_classes) int64 counts, rows = label, columns = prediction."""
    pred, target = pred.flatten().long(), target.flatten().long()
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    pred, target = pred[keep], target[keep]
    bad = (target < 0) | (target >= num_classes)
    if bad.any():
        raise ValueError(f"label value {int(target[bad][0])} is outside 0..{num_classes - 1} and not the ignore "
                         f"index {ignore_index}")
    return torch.bincount(target * num_classes + pred, minlength=num_classes**2).reshape(num_classes, num_classes)


def segmentation_scores(confusion: Tensor) -> dict[str, float | list[float]]:
    """``miou`` (percent, over classes present in label or prediction), ``pixel_accuracy`` (percent) and
    ``iou`` per class (percent, NaN when absent from both)."""
    confusion = confusion.double()
    tp = confusion.diagonal()
    union = confusion.sum(0) + confusion.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.nan)
    present = ~iou.isnan()
    total = confusion.sum()
    return {"miou": 100.0 * float(iou[present].mean()) if present.any() else float("nan"),
            "pixel_accuracy": 100.0 * float(tp.sum() / total) if total > 0 else float("nan"),
            "iou": (100.0 * iou).tolist()}


def eigen_crop(height: int, width: int) -> tuple[slice, slice]:
    """The NYU-v2 Eigen crop (rows 45:471, columns 41:601 of 480 x 640), scaled to ``height`` x ``width``."""
    return (slice(round(45 * height / 480), round(471 * height / 480)),
            slice(round(41 * width / 640), round(601 * width / 640)))


def depth_valid(gt: Tensor, min_depth: float = 1e-3, max_depth: float = 10.0) -> Tensor:
    """Boolean mask of the pixels with ground truth to evaluate: finite, ``min_depth`` < gt <= ``max_depth``."""
    return gt.isfinite() & (gt > min_depth) & (gt <= max_depth)


def depth_scores(pairs: Iterable[tuple[Tensor, Tensor]], *, crop: bool = False, min_depth: float = 1e-3,
                 max_depth: float = 10.0) -> dict[str, float]:
    """Depth errors over (prediction, label) pairs of (H, W) maps in metres (see the module docstring)."""
    rmse, abs_rel, delta, squared, count = [], [], [], 0.0, 0
    for pred, gt in pairs:
        if crop:
            rows, cols = eigen_crop(*gt.shape[-2:])
            pred, gt = pred[..., rows, cols], gt[..., rows, cols]
        valid = depth_valid(gt, min_depth, max_depth)  # in the label's own precision, as the toolbox compares
        if not valid.any():
            continue
        p, g = pred.double()[valid].clamp(min=1e-6), gt.double()[valid]
        error = (p - g) ** 2
        rmse.append(float(error.mean().sqrt()))
        abs_rel.append(float(((p - g).abs() / g).mean()))
        delta.append(float((torch.maximum(p / g, g / p) < 1.25).double().mean()))
        squared += float(error.sum())
        count += int(valid.sum())
    if not count:
        raise ValueError(f"no valid depth pixels ({min_depth} < label <= {max_depth}) to evaluate")
    return {"rmse": sum(rmse) / len(rmse), "rmse_pooled": (squared / count) ** 0.5,
            "abs_rel": sum(abs_rel) / len(abs_rel), "delta1": sum(delta) / len(delta)}
