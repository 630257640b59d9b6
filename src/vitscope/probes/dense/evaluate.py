"""Scoring many dense heads on one evaluation set at once, image by image: per-image confusion matrices
(segmentation) and per-image depth errors (depth).

A dataset-level mIoU is a ratio of pixel counts summed over images, so comparisons need each image's own
confusion matrix (``vitscope.probes.dense.intervals`` resamples them). ``segment_confusions`` computes them for
several heads that read the same features in one pass: each image's low-resolution logits of every head are
upsampled together by the same separable bilinear arithmetic as ``vitscope.probes.dense.tiles`` (columns once,
then tiles of label rows), so each head's prediction equals ``predict_full``'s exactly, and one ``bincount`` per
tile counts every head's (label, prediction) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from vitscope.metrics.dense import confusion_matrix, depth_scores, depth_valid, eigen_crop
from vitscope.probes.dense.modules import DenseHead, HeadInputs
from vitscope.probes.dense.tiles import TILE_VALUES, tile_rows, upsample_columns, upsample_rows

HEADS_PER_PASS = 32  # heads upsampled together (memory: heads x classes x tile)
EVAL_CHUNK = 16  # images whose low-resolution logits are computed together, as ``iter_predictions``


@torch.no_grad()
def segment_confusions(heads: Sequence[DenseHead], inputs: HeadInputs, targets: Sequence[Tensor], num_classes: int,
                       ignore_index: int | None = None, *, device: torch.device | str = "cpu",
                       tile_values: int = TILE_VALUES) -> Tensor:
    """(heads, images, C, C) int64 confusion counts (rows = label, columns = prediction) of ``heads`` on
    ``inputs`` (one entry per image) against ``targets`` (H_i, W_i); pixels at ``ignore_index`` are left out, a
    label outside 0..C-1 is an error naming it."""
    out = torch.zeros(len(heads), len(targets), num_classes, num_classes, dtype=torch.long)
    for start in range(0, len(heads), HEADS_PER_PASS):
        chunk = list(heads[start: start + HEADS_PER_PASS])
        for first in range(0, len(targets), EVAL_CHUNK):  # the images ``iter_predictions`` computes together
            images = list(range(first, min(len(targets), first + EVAL_CHUNK)))
            low = [_low_res(head, inputs, images, device) for head in chunk]  # each (B, C, rows, cols)
            for offset, index in enumerate(images):
                logits = torch.cat([one[offset] for one in low])  # (heads x C, rows, cols)
                out[start: start + len(chunk), index] = _confusions(logits, targets[index], len(chunk), num_classes,
                                                                    ignore_index, tile_values)
    return out


def _low_res(head: DenseHead, inputs: HeadInputs, images: list[int], device: torch.device | str) -> Tensor:
    cls = inputs.cls[images] if head.with_cls else None
    return head.low_res(inputs.patches[images].to(device), cls, inputs.grid).float()


def _confusions(logits: Tensor, target: Tensor, heads: int, num_classes: int, ignore_index: int | None,
                tile_values: int) -> Tensor:
    """(heads, C, C) counts of one image from the heads' stacked (heads x C, rows, cols) logits."""
    height, width = target.shape[-2:]
    columns = upsample_columns(logits, width)
    target = target.to(logits.device).long()
    if ignore_index is None:
        valid = torch.ones_like(target, dtype=torch.bool)
    else:
        valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= num_classes))
    if bad.any():
        raise ValueError(f"label value {int(target[bad][0])} is outside 0..{num_classes - 1} and not the ignore "
                         f"index {ignore_index}")
    counts = torch.zeros(heads * num_classes * num_classes, dtype=torch.long, device=logits.device)
    step = tile_rows(logits.shape[0], width, tile_values)
    offsets = (torch.arange(heads, device=logits.device) * num_classes * num_classes)[:, None]
    for row in range(0, height, step):
        stop = min(height, row + step)
        tile = upsample_rows(columns, height, row, stop)  # (heads x C, t, W)
        # argmax over the classes (the first of ties, as argmax), (heads, t x W)
        pred = tile.unflatten(0, (heads, num_classes)).max(1).indices.flatten(1)
        keep = valid[row:stop].flatten()
        labels = target[row:stop].flatten()[keep]
        flat = offsets + labels[None] * num_classes + pred[:, keep]
        counts += torch.bincount(flat.flatten(), minlength=counts.numel())
    return counts.view(heads, num_classes, num_classes).cpu()


def segment_confusions_by_prediction(heads: Sequence[DenseHead], predict: Callable[[DenseHead], Iterator[Tensor]],
                                     targets: Sequence[Tensor], num_classes: int, ignore_index: int | None = None
                                     ) -> Tensor:
    """(heads, images, C, C) confusions from each head's per-image class maps (``predict(head)`` yields them in
    image order; e.g. ``iter_predictions`` with sliding windows)."""
    out = torch.zeros(len(heads), len(targets), num_classes, num_classes, dtype=torch.long)
    for h, head in enumerate(heads):
        for index, (pred, target) in enumerate(zip(predict(head), targets, strict=True)):
            out[h, index] = confusion_matrix(pred, target, num_classes, ignore_index)
    return out


DEPTH_METRICS = ("rmse", "abs_rel", "delta1")


def depth_values(heads: Sequence[DenseHead], predict: Callable[[DenseHead], Iterator[Tensor]],
                 targets: Sequence[Tensor], *, crop: bool = False, min_depth: float = 1e-3, max_depth: float = 10.0
                 ) -> tuple[dict[str, Tensor], Tensor]:
    """Per-image depth errors of each head: ({metric: (heads, images)} for ``DEPTH_METRICS``, NaN for an image
    without a valid pixel) and each image's count of scored pixels (images,), from which the pooled RMSE is
    sqrt(sum count x rmse² / sum count)."""
    counts = torch.tensor([float(_scored(t, crop, min_depth, max_depth).sum()) for t in targets])
    values = {metric: torch.full((len(heads), len(targets)), math.nan, dtype=torch.float64) for metric in DEPTH_METRICS}
    for h, head in enumerate(heads):
        for index, (pred, target) in enumerate(zip(predict(head), targets, strict=True)):
            if counts[index] == 0:
                continue
            scores = depth_scores([(pred, target)], crop=crop, min_depth=min_depth, max_depth=max_depth)
            for metric in DEPTH_METRICS:
                values[metric][h, index] = scores[metric]
    return values, counts


def _scored(target: Tensor, crop: bool, min_depth: float, max_depth: float) -> Tensor:
    if crop:
        rows, cols = eigen_crop(*target.shape[-2:])
        target = target[..., rows, cols]
    return depth_valid(target, min_depth, max_depth)
