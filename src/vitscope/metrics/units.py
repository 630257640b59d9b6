"""Image-clustered units of a results row: per-image sums and counts of per-token values, which
``vitscope.stats.compare`` resamples (images, never tokens)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def per_image(values: Tensor, images: Tensor) -> dict[str, list]:
    """Per-token ``values`` (M,) summed per image (``images`` (M,) dataset indices): ``{"images", "sums",
    "counts"}``, images ascending, sums in float64."""
    names, index = torch.as_tensor(images).long().unique(return_inverse=True)
    sums = torch.zeros(len(names), dtype=torch.float64).index_add_(0, index, values.double().cpu())
    counts = torch.bincount(index, minlength=len(names))
    return {"images": names.tolist(), "sums": sums.tolist(), "counts": counts.tolist()}


def per_image_picked(values: Tensor, pick: Tensor) -> dict[str, list]:
    """``per_image`` of the picked entries of ``values`` (images, patches), ``pick`` a boolean mask of that shape
    (row i is image i); images with no picked patch are left out."""
    return per_image(values[pick], pick.nonzero()[:, 0])


def unit_values(units: dict[str, list]) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit values and image labels from ``per_image``'s sums and counts: each image's mean repeated once per
    unit, which gives an image-clustered interval (``vitscope.stats.compare`` with ``clusters``) exactly each
    image's sum and count."""
    counts = np.asarray(units["counts"], dtype=int)
    means = np.asarray(units["sums"], dtype=float) / np.maximum(counts, 1)
    return np.repeat(means, counts), np.repeat(np.asarray(units["images"]), counts)
