"""Geometric crops cut in DataLoader workers from full-size streamed images, and the batches they make.

A cutter turns one decoded image (uint8 (3, H, W)) into what the training step needs (uint8 crops), with
every random number drawn from ``image_uniforms(seed, epoch, index)``: an image gets the same crops whatever
worker, rank or batch it lands in, and the same crop boxes as the in-memory path for the same (seed, epoch,
index). Full-size images never leave the workers; the photometric augmentations run batched on the device.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vitscope.data.augment import image_uniforms
from vitscope.data.multicrop import MultiCropSpec, cut_views, view_uniforms
from vitscope.data.pixels import DEFAULT_CROP_PCT, eval_view
from vitscope.data.stream import StreamedDataset

Crops = Tensor | list[Tensor]


def to_uint8(x: Tensor) -> Tensor:
    """[0, 1] floats -> uint8, rounded to the nearest level (at most 0.5 / 255 from ``x``)."""
    return (x * 255.0).round().clamp(0, 255).to(torch.uint8)


@dataclass(frozen=True)
class MultiCropCutter:
    """DINO's global and local crops of one image, as uint8 (3, G, G) x 2 then (3, L, L) x n_local."""

    spec: MultiCropSpec

    def __call__(self, image: Tensor, seed: int, epoch: int, index: int) -> list[Tensor]:
        u = view_uniforms(seed, epoch, torch.tensor([index]), self.spec)
        return [to_uint8(crop[0]) for crop in cut_views(image[None].float() / 255.0, u, self.spec)]


@dataclass(frozen=True)
class PadCropCutter:
    """The supervised protocols' random crop of one image: its evaluation view at ``size`` (``eval_view`` with
    ``crop_pct``: the pixels an in-memory set decoded at ``image_size`` holds), zero-padded by ``padding`` and cut
    back at an offset drawn per image -> uint8 (3, size, size)."""

    size: int
    padding: int
    crop_pct: float = DEFAULT_CROP_PCT

    def __call__(self, image: Tensor, seed: int, epoch: int, index: int) -> Tensor:
        image = eval_view(image, self.size, self.crop_pct)
        if self.padding <= 0:
            return image
        u = image_uniforms(seed, epoch, torch.tensor([index]), 2)[0]
        dy, dx = (int(v * (2 * self.padding + 1)) for v in u.tolist())
        padded = torch.nn.functional.pad(image, (self.padding,) * 4)
        return padded[:, dy : dy + self.size, dx : dx + self.size]


class _CroppedImages(Dataset):
    """``dataset[(epoch, index)]`` -> (crops, label, index): the image decoded and cut in the worker."""

    def __init__(self, dataset: StreamedDataset, cutter, seed: int):
        self.dataset, self.cutter, self.seed = dataset, cutter, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> tuple[Crops, int, int]:
        epoch, index = key
        crops = self.cutter(self.dataset.decode(index), self.seed, epoch, index)
        return crops, int(self.dataset.labels[index]), index


def _collate(samples: list[tuple[Crops, int, int]]) -> tuple[Crops, Tensor, Tensor]:
    crops, labels, indices = zip(*samples, strict=True)
    stacked = torch.stack(crops) if isinstance(crops[0], Tensor) else [torch.stack(v) for v in zip(*crops,
                                                                                                  strict=True)]
    return stacked, torch.tensor(labels), torch.tensor(indices)


def _one_thread(_worker: int) -> None:
    torch.set_num_threads(1)  # workers are processes; one thread each avoids oversubscribing the cores


def cropped_batches(dataset: StreamedDataset, cutter, seed: int, epoch: int, batches: Sequence[Tensor], *,
                    workers: int, pin_memory: bool = False, prefetch: int = 2
                    ) -> Iterator[tuple[Crops, Tensor, Tensor]]:
    """For each index batch (B,) of ``batches``, in order: (crops, labels (B,), indices (B,)) with the crops
    stacked per view ((B, 3, S, S), or a list of them), decoded and cut by ``workers`` processes (0: here).

    The loader draws no number from torch's global generator, so a run's random state does not depend on it.
    """
    keys = [[(epoch, int(i)) for i in batch] for batch in batches]
    loader = DataLoader(_CroppedImages(dataset, cutter, seed), batch_sampler=keys, num_workers=workers,
                        collate_fn=_collate, pin_memory=pin_memory, worker_init_fn=_one_thread if workers else None,
                        prefetch_factor=prefetch if workers else None, generator=torch.Generator().manual_seed(seed))
    yield from loader
