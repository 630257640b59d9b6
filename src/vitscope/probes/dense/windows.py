"""Dense-probe geometry at a short side: random training crops and sliding-window evaluation.

Each image is resized so its short side is ``size`` pixels (bilinear, antialiased); a training target follows it
with nearest-neighbour resizing (labels are never interpolated otherwise). Training uses ``per_image`` seeded random
crops of ``window`` x ``window`` pixels (the backbone's input side); an image whose short side is below ``window``
is resized whole to ``window`` x ``window`` instead. Evaluation slides a ``window`` x ``window`` window with stride
``stride`` over the resized image (the last window aligned with the border), averages the overlapping logits (or
depth), and upsamples the result bilinearly to the label's own size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from vitscope.data.dataset import ImageDataset
from vitscope.data.dense import DenseDataset


def short_side_size(height: int, width: int, size: int) -> tuple[int, int]:
    scale = size / min(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def _resize_image(image: Tensor, shape: tuple[int, int]) -> Tensor:
    return F.interpolate(image[None].float(), size=shape, mode="bilinear", align_corners=False,
                         antialias=True).round().clamp(0, 255).to(torch.uint8)[0]


def _resize_target(target: Tensor, shape: tuple[int, int]) -> Tensor:
    return F.interpolate(target[None, None].float(), size=shape, mode="nearest")[0, 0].to(target.dtype)


def window_starts(length: int, window: int, stride: int) -> list[int]:
    """Window offsets covering 0..length (the last one ends at the border); [0] when the length fits."""
    if length <= window:
        return [0]
    starts = list(range(0, length - window + 1, stride))
    return starts if starts[-1] == length - window else [*starts, length - window]


def train_crops(data: DenseDataset, size: int, window: int, per_image: int = 1, seed: int = 0) -> DenseDataset:
    """``per_image`` random ``window``-pixel crops of each image (and target) resized to short side ``size``."""
    generator = torch.Generator().manual_seed(seed)
    images, targets = [], []
    for image, target in zip(data.images, data.targets, strict=True):
        shape = short_side_size(*image.shape[-2:], size)
        if min(shape) < window:
            images.append(_resize_image(image, (window, window)))
            targets.append(_resize_target(target, (window, window)))
            continue
        image, target = _resize_image(image, shape), _resize_target(target, shape)
        for _ in range(per_image):
            y = int(torch.randint(0, shape[0] - window + 1, (1,), generator=generator))
            x = int(torch.randint(0, shape[1] - window + 1, (1,), generator=generator))
            images.append(image[:, y : y + window, x : x + window])
            targets.append(target[y : y + window, x : x + window])
    return DenseDataset(data.name, data.split, data.task, images, targets, data.classes, data.ignore_index,
                        data.mean, data.std, data.root, settings={**data.settings, "crops": {
                            "size": size, "window": window, "per_image": per_image, "seed": seed}})


def eval_windows(data: DenseDataset, size: int, window: int, stride: int
                 ) -> tuple[ImageDataset, list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The windows of every resized eval image as one ``ImageDataset`` (labels 0), each window's (image, y, x),
    and each image's resized (height, width)."""
    windows, placements, shapes = [], [], []
    for index, image in enumerate(data.images):
        shape = short_side_size(*image.shape[-2:], size)
        shape = (max(shape[0], window), max(shape[1], window))
        resized = _resize_image(image, shape)
        shapes.append(shape)
        for y in window_starts(shape[0], window, stride):
            for x in window_starts(shape[1], window, stride):
                windows.append(resized[:, y : y + window, x : x + window])
                placements.append((index, y, x))
    stacked = torch.stack(windows) if windows else torch.zeros(0, 3, window, window, dtype=torch.uint8)
    view = ImageDataset(f"{data.name}-windows", data.split, stacked, torch.zeros(len(windows), dtype=torch.long),
                        ["-"], data.mean, data.std, data.root)
    return view, placements, shapes


def stitch(outputs: Tensor, offsets: Sequence[tuple[int, int]], shape: tuple[int, int],
           label_size: tuple[int, int]) -> Tensor:
    """Average one image's window outputs (k, C, window, window), placed at ``offsets`` (y, x) on its resized
    ``shape``, and upsample bilinearly to ``label_size``: (C, H, W)."""
    window = outputs.shape[-1]
    canvas = outputs.new_zeros(outputs.shape[1], *shape)
    count = outputs.new_zeros(1, *shape)
    for output, (y, x) in zip(outputs, offsets, strict=True):
        canvas[:, y : y + window, x : x + window] += output
        count[:, y : y + window, x : x + window] += 1
    averaged = canvas / count.clamp(min=1)
    return F.interpolate(averaged[None], size=tuple(label_size), mode="bilinear", align_corners=False)[0]
