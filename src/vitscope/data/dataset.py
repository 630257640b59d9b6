"""Decoded image datasets held as uint8 tensors, and batching for evaluation."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class ImageDataset:
    """A labelled image set in memory.

    ``images`` is uint8 (N, C, H, W); ``labels`` int64 (N,); ``classes`` the class names; ``mean`` and
    ``std`` the per-channel statistics (in [0, 1] units) used to normalise model inputs. ``extras`` may
    hold dense targets such as ``boxes`` (N, 4) pixels x0, y0, x1, y1, ``masks`` (N, H, W) and ``depth``.
    ``selection`` describes how a subset was drawn (None for the whole split); runs record it in provenance.
    ``view`` is the ``vitscope.data.pixels.View`` every image already is (None: images at their own size, or a
    view no model named), so a model that takes that view uses them as they are.
    """

    name: str
    split: str
    images: Tensor
    labels: Tensor
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    root: str | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    selection: dict[str, Any] | None = None
    view: Any = None

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {self.images.dtype} {tuple(self.images.shape)}")
        if len(self.labels) != len(self.images):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])

    def images_at(self, rows: Tensor | slice) -> Tensor:
        """uint8 images (B, C, H, W) at ``rows`` (the twin of ``StreamedDataset.images_at``)."""
        return self.images[rows]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_size(self) -> int:
        return int(self.images.shape[-1])

    def subset(self, count: int | None, seed: int = 0) -> ImageDataset:
        """A seeded, class-stratified sample of ``count`` images (the whole set when None or >= its size).

        Each class keeps its share of ``count`` (largest remainders, ties broken by the seed), drawn at
        random within the class; the same seed gives the same images. Images keep their dataset order.
        ``selection`` of the result records the count, seed, method and a digest of the chosen indices.
        """
        if count is None or count >= len(self):
            return self
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"subset size {count!r} must be a positive integer (or None for all images)")
        index = stratified_indices(self.labels, count, seed)
        extras = {k: v[index] for k, v in self.extras.items()}
        selection = sample_record(index, count, len(self), seed)
        if self.selection is not None:
            selection["from"] = self.selection
        return ImageDataset(self.name, self.split, self.images[index], self.labels[index], self.classes,
                            self.mean, self.std, self.root, extras, selection, self.view)


def sample_record(index: Tensor, count: int, total: int, seed: int) -> dict[str, Any]:
    """How a sample was drawn, for provenance: count, of how many, seed, method and a digest of ``index``."""
    return {"method": "class-stratified", "count": count, "of": total, "seed": seed,
            "indices_sha1": hashlib.sha1(index.numpy().tobytes()).hexdigest()}


def stratified_indices(labels: Tensor, count: int, seed: int) -> Tensor:
    """Sorted indices (count,) of a seeded sample with each class's share of ``count`` (labels (N,) int64).

    Quotas are ``count * class_size / N`` rounded down; the leftover images go to the classes with the
    largest remainders, ties in a seeded random order (so a sample smaller than the class count is not
    always the first classes)."""
    generator = torch.Generator().manual_seed(seed)
    classes, sizes = torch.unique(labels, return_counts=True)
    exact = sizes.double() * count / len(labels)
    quota = exact.floor().long()
    order = torch.randperm(len(classes), generator=generator)
    remainder = (exact - quota)[order]
    winners = order[torch.argsort(remainder, descending=True, stable=True)][: count - int(quota.sum())]
    quota[winners] += 1
    chosen = []
    for cls, take in zip(classes.tolist(), quota.tolist(), strict=True):
        members = torch.nonzero(labels == cls).flatten()
        chosen.append(members[torch.randperm(len(members), generator=generator)[:take]])
    return torch.sort(torch.cat(chosen)).values


def normalize(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 or [0, 1] float images (B, C, H, W) -> float32 standardised per channel."""
    x = images.float()
    if images.dtype == torch.uint8:
        x = x / 255.0
    # non-blocking: a GPU training step must not wait for the host (same values as a blocking copy)
    m = torch.tensor(mean).to(x.device, non_blocking=True).view(1, -1, 1, 1)
    s = torch.tensor(std).to(x.device, non_blocking=True).view(1, -1, 1, 1)
    return (x - m) / s


def raw_batches(dataset: ImageDataset, batch_size: int, device: torch.device | str = "cpu", *, rank: int = 0,
                world_size: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
    """uint8 images (B, C, H, W) and labels (B,) on ``device`` in dataset order; with ``world_size`` > 1 this
    rank takes every ``world_size``-th batch."""
    if batch_size < 1:
        raise ValueError(f"batch size {batch_size} must be >= 1")
    for start in range(rank * batch_size, len(dataset), batch_size * world_size):
        images = dataset.images_at(slice(start, start + batch_size)).to(device, non_blocking=True)
        yield images, dataset.labels[start : start + batch_size].to(device)


def eval_batches(dataset: ImageDataset, batch_size: int, device: torch.device | str = "cpu", *, rank: int = 0,
                 world_size: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
    """Images normalised with the dataset's statistics (float32) and labels, as ``raw_batches``."""
    for images, labels in raw_batches(dataset, batch_size, device, rank=rank, world_size=world_size):
        yield normalize(images, dataset.mean, dataset.std), labels
