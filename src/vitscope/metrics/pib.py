"""Point-in-Box (PiB): does the highest-scoring patch of an image fall inside a ground-truth box?

For each image, every patch of a ``rows x cols`` grid gets a score (CLS-to-patch attention, token norm, cosine to
CLS, ...). A hit is an image whose single top-scoring patch has its centre inside any of its boxes (edges
included). An image whose top score is shared by more than one patch (for example a sparse CLS row with no mass
on patches, where every score is 0) is a tie and counts as a miss. PiB is the percentage of hits. Its chance level
is the mean over the same images of the fraction of patch centres inside any box (a uniformly drawn patch).

Boxes are (N, 4) or (N, K, 4) as x0, y0, x1, y1 in pixels of the grid's image (patch ``size`` pixels per cell);
rows of NaN pad images with fewer than K boxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PointInBox:
    """``pib`` and ``chance`` in percent, over ``images`` images; ``ties`` counts tied images (misses)."""

    pib: float
    chance: float
    images: int
    ties: int


def centres_in_boxes(boxes: Tensor, grid: tuple[int, int], size: float) -> Tensor:
    """(N, rows * cols) bool: patch centre inside any of the image's boxes."""
    boxes = boxes.float()
    boxes = boxes[:, None] if boxes.ndim == 2 else boxes
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must be (N, 4) or (N, K, 4) as x0, y0, x1, y1; got {tuple(boxes.shape)}")
    rows, cols = grid
    cy = (torch.arange(rows, dtype=torch.float32) + 0.5) * size
    cx = (torch.arange(cols, dtype=torch.float32) + 0.5) * size
    yy, xx = torch.meshgrid(cy, cx, indexing="ij")
    xx, yy = xx.flatten()[None, None], yy.flatten()[None, None]  # (1, 1, P)
    x0, y0, x1, y1 = (boxes[..., i, None] for i in range(4))  # (N, K, 1)
    inside = (xx >= x0) & (xx <= x1) & (yy >= y0) & (yy <= y1)  # NaN boxes compare False
    return inside.any(dim=1)


def point_in_box(scores: Tensor, boxes: Tensor, grid: tuple[int, int], size: float) -> PointInBox:
    """PiB of patch ``scores`` (N, rows * cols) against ``boxes`` (see the module docstring)."""
    if scores.ndim != 2 or scores.shape[1] != grid[0] * grid[1]:
        raise ValueError(f"scores {tuple(scores.shape)} must be (images, {grid[0] * grid[1]}) for grid {grid}")
    if len(boxes) != len(scores):
        raise ValueError(f"{len(scores)} score rows but boxes for {len(boxes)} images")
    inside = centres_in_boxes(boxes, grid, size)
    top = scores.max(dim=1, keepdim=True).values
    at_top = scores == top
    tied = at_top.sum(1) > 1
    best = scores.argmax(dim=1)
    hits = inside.gather(1, best[:, None]).squeeze(1) & ~tied
    n = len(scores)
    return PointInBox(pib=100.0 * float(hits.float().mean()) if n else float("nan"),
                      chance=100.0 * float(inside.float().mean(1).mean()) if n else float("nan"),
                      images=n, ties=int(tied.sum()))
