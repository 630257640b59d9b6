"""Dense datasets: images of any size, each with a segmentation mask or a depth map of the same size.

``DenseDataset.images`` holds uint8 (3, H, W) tensors, ``targets`` int64 (H, W) class maps (``task="segmentation"``,
``ignore_index`` pixels left out) or float32 (H, W) depth in metres (``task="depth"``, 0 = no measurement).
Synthetic scenes give both kinds (``synthetic_dense``); the file layouts are in ``vitscope.data.dense_layouts``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitscope.data.dataset import ImageDataset
from vitscope.data.synthetic import SYNTHETIC_MEAN, SYNTHETIC_STD, class_names, synthetic_scenes

TASKS = ("segmentation", "depth")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass
class DenseDataset:
    """Images (3, H, W) uint8 with per-pixel targets (H, W); see the module docstring."""

    name: str
    split: str
    task: str
    images: list[Tensor]
    targets: list[Tensor]
    classes: list[str] = field(default_factory=list)
    ignore_index: int | None = None
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    root: str | None = None
    files: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} is unknown; use {', '.join(TASKS)}")
        if len(self.images) != len(self.targets):
            raise ValueError(f"{len(self.images)} images but {len(self.targets)} targets")
        for i, (image, target) in enumerate(zip(self.images, self.targets, strict=True)):
            if image.shape[-2:] != target.shape[-2:]:
                where = self.files[i] if i < len(self.files) else f"image {i}"
                raise ValueError(f"{where}: target {tuple(target.shape[-2:])} and image {tuple(image.shape[-2:])} "
                                 "differ in size; masks and depth maps must match their image pixel for pixel")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(self, count: int | None, seed: int = 0) -> DenseDataset:
        """A seeded random sample of ``count`` images (all when None or larger), in dataset order."""
        if count is None or count >= len(self):
            return self
        index = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:count].sort().values
        pick = index.tolist()
        return DenseDataset(self.name, self.split, self.task, [self.images[i] for i in pick],
                            [self.targets[i] for i in pick], self.classes, self.ignore_index, self.mean, self.std,
                            self.root, [self.files[i] for i in pick] if self.files else [],
                            {**self.settings, "subset": {"count": count, "of": len(self), "seed": seed,
                                                         "method": "seeded random"}})

    def model_view(self, side: int) -> ImageDataset:
        """The images resized (bilinear, antialiased) to ``side`` x ``side`` as an ``ImageDataset`` (labels 0),
        the input the backbone sees; the targets keep their own size."""
        resized = [F.interpolate(image[None].float(), size=(side, side), mode="bilinear", align_corners=False,
                                 antialias=True).round().clamp(0, 255).to(torch.uint8)[0] for image in self.images]
        images = torch.stack(resized) if resized else torch.zeros(0, 3, side, side, dtype=torch.uint8)
        return ImageDataset(f"{self.name}-dense", self.split, images, torch.zeros(len(images), dtype=torch.long),
                            ["-"], self.mean, self.std, self.root)


def synthetic_dense(task: str, split: str = "train", num_images: int | None = None, image_size: int = 32,
                    num_classes: int = 8, seed: int = 0, cue: str = "shape") -> DenseDataset:
    """Synthetic scenes with their masks (0 = background, 1 + class: the shape, or with ``cue='texture'`` the
    texture of the four objects; no ignored pixels) or depth."""
    scenes = synthetic_scenes(split, num_images, image_size, num_classes, seed, cue=cue)
    name = "synthetic" if cue == "shape" else f"synthetic-{cue}"
    if task == "segmentation":
        targets = [mask.long() for mask in scenes.extras["masks"]]
        classes = ["background", *class_names(num_classes, cue)]
    elif task == "depth":
        targets, classes = list(scenes.extras["depth"].float()), []
    else:
        raise ValueError(f"task {task!r} is unknown; use {', '.join(TASKS)}")
    return DenseDataset(name, split, task, list(scenes.images), targets, classes, None, SYNTHETIC_MEAN,
                        SYNTHETIC_STD)
