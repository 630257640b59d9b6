"""Synthetic dense sets of real-world shapes for the dense-probe benchmark: piecewise regions with texture.

Each image is a Voronoi partition into ``regions`` cells (on a 4-pixel grid); each cell has a class
(segmentation) or a depth plane (depth) and a texture of its own class (a palette colour, oriented stripes of a
class-specific period, pixel noise), so a head has something to learn. Segmentation labels are 255 (ignored)
within 2 pixels of a cell border; depth labels are 0 (no measurement) on 5 % of the pixels, as a depth sensor's
holes.
"""

from __future__ import annotations

import numpy as np
import torch

from vitscope.data.dense import DenseDataset


def _scene(rng: np.random.Generator, height: int, width: int, classes: int, regions: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(3, H, W) uint8 image, (H, W) cell index, (H, W) class of the cell."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    seeds = rng.uniform((0, 0), (height, width), size=(regions, 2)).astype(np.float32)
    cy, cx = yy[::4, ::4], xx[::4, ::4]  # cells on a 4-pixel grid (fast), nearest-upsampled
    cells = np.argmin((cy[None] - seeds[:, 0, None, None]) ** 2 + (cx[None] - seeds[:, 1, None, None]) ** 2, 0)
    cells = cells.repeat(4, 0).repeat(4, 1)[:height, :width]
    cell_class = rng.integers(0, classes, regions)[cells]
    palette = np.random.default_rng(1234).uniform(0.15, 0.85, (classes, 3)).astype(np.float32)
    angle = np.pi * np.arange(classes) / classes
    period = 4.0 + 2.0 * (np.arange(classes) % 4)
    stripes = np.sin(2 * np.pi * (xx * np.cos(angle[cell_class]) + yy * np.sin(angle[cell_class]))
                     / period[cell_class])
    image = palette[cell_class].transpose(2, 0, 1) + 0.12 * stripes[None]
    image = image + 0.04 * rng.standard_normal(image.shape, dtype=np.float32)
    return (np.clip(image, 0, 1) * 255).astype(np.uint8), cells, cell_class


def piecewise_dense(task: str, count: int, height: int, width: int, classes: int = 11, regions: int = 14,
                    seed: int = 0) -> DenseDataset:
    rng = np.random.default_rng(seed)
    images, targets = [], []
    for _ in range(count):
        image, cells, cell_class = _scene(rng, height, width, classes, regions)
        if task == "segmentation":
            border = np.zeros_like(cells, dtype=bool)
            for shift in (1, 2):
                border[shift:] |= cells[shift:] != cells[:-shift]
                border[:, shift:] |= cells[:, shift:] != cells[:, :-shift]
            target = torch.from_numpy(np.where(border, 255, cell_class).astype(np.int64))
        else:
            planes = rng.uniform((1.0, -3.0, -3.0), (8.0, 3.0, 3.0), size=(regions, 3)).astype(np.float32)
            yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
            plane = planes[cells]
            depth = np.clip(plane[..., 0] + plane[..., 1] * yy / height + plane[..., 2] * xx / width, 0.5, 9.5)
            depth[rng.random(depth.shape) < 0.05] = 0.0
            target = torch.from_numpy(depth.astype(np.float32))
        images.append(torch.from_numpy(image))
        targets.append(target)
    names = [f"class{c}" for c in range(classes)] if task == "segmentation" else []
    return DenseDataset("piecewise", "train", task, images, targets, names, 255 if task == "segmentation" else None)
