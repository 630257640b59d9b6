"""Datasets read from disk image by image (``StreamedDataset``), for sets too large to decode into memory.

A streamed set holds only its labels, class names and a reader (image files, or samples in WebDataset tar
shards); images are decoded on demand with torchvision's decoders, normally in DataLoader worker processes
(``vitscope.data.worker_crops``). Random access by index keeps the training engine's data order, so a streamed
run visits images in the order an in-memory run would, and resumes mid-epoch at the same place.
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from vitscope.data.dataset import ImageDataset, stratified_indices
from vitscope.data.image_decode import decode_rgb, image_header_size
from vitscope.data.image_trees import mixed_sizes
from vitscope.data.pixels import (
    DEFAULT_CROP_PCT,
    DEFAULT_INTERPOLATION,
    View,
    check_crop_pct,
    check_interpolation,
    eval_view,
    view_boxes,
)

__all__ = ["FileReader", "ImageReader", "StreamedDataset", "decode_rgb", "eval_view", "image_header_size"]


class ImageReader(Protocol):
    """Random access to encoded images: ``read(i)`` -> (bytes, a name for messages). Must pickle (workers)."""

    def __len__(self) -> int: ...

    def read(self, index: int) -> tuple[bytes, str]: ...


@dataclass(frozen=True)
class FileReader:
    """Image files ``root / paths[i]``."""

    root: Path
    paths: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> tuple[bytes, str]:
        path = self.root / self.paths[index]
        try:
            return path.read_bytes(), str(path)
        except OSError as err:
            raise ValueError(f"cannot read image {path}: {err}; check the file exists and is readable") from None


@dataclass
class StreamedDataset:
    """A labelled image set decoded on demand.

    ``labels`` int64 (N,); ``reader`` the encoded images, addressed through ``items`` (N,) (the positions of
    this set's images in the reader, so subsets share the reader); ``image_size`` the side in pixels of the
    evaluation views (``images_at``) and of supervised training inputs, ``crop_pct`` the fraction of the resized
    shorter side those views keep and ``interpolation`` their resampling (``vitscope.data.pixels.eval_view``);
    ``extras`` per-image targets such as
    ``boxes`` (N, K, 4) in the original image's pixels x0, y0, x1, y1 (NaN rows pad). The rest as
    ``ImageDataset``.
    """

    name: str
    split: str
    reader: ImageReader
    labels: Tensor
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_size: int = 224
    root: str | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    selection: dict[str, Any] | None = None
    items: Tensor | None = None
    crop_pct: float = DEFAULT_CROP_PCT
    interpolation: str = DEFAULT_INTERPOLATION

    def __post_init__(self) -> None:
        if self.items is None:
            self.items = torch.arange(len(self.reader))
        if len(self.labels) != len(self.items):
            raise ValueError(f"{len(self.items)} images but {len(self.labels)} labels")
        if self.image_size < 1:
            raise ValueError(f"image_size={self.image_size} must be >= 1 (pixels)")
        check_crop_pct(self.crop_pct)
        check_interpolation(self.interpolation)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def view(self) -> View:
        """The view ``images_at`` gives: ``image_size``, ``crop_pct`` and ``interpolation`` (``eval_view``)."""
        return View(self.image_size, self.crop_pct, self.interpolation)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def read(self, index: int) -> tuple[bytes, str]:
        """The encoded bytes of image ``index`` and its name for messages."""
        return self.reader.read(int(self.items[index]))

    def decode(self, index: int) -> Tensor:
        """Image ``index`` at its own size, uint8 (3, H, W)."""
        return decode_rgb(*self.read(index))

    def images_at(self, rows: Tensor | slice) -> Tensor:
        """Evaluation views uint8 (B, 3, image_size, image_size) of images ``rows`` (decoded in threads)."""
        index = torch.arange(len(self))[rows] if isinstance(rows, slice) else rows
        with ThreadPoolExecutor(max_workers=4) as pool:
            views = list(pool.map(lambda i: self.view(self.decode(int(i))), index.tolist()))
        return torch.stack(views) if views else torch.zeros(0, 3, self.image_size, self.image_size,
                                                            dtype=torch.uint8)

    def subset(self, count: int | None, seed: int = 0) -> StreamedDataset:
        """A seeded, class-stratified sample of ``count`` images, as ``ImageDataset.subset``."""
        if count is None or count >= len(self):
            return self
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"subset size {count!r} must be a positive integer (or None for all images)")
        index = stratified_indices(self.labels, count, seed)
        selection = {"method": "class-stratified", "count": count, "of": len(self), "seed": seed,
                     "indices_sha1": hashlib.sha1(index.numpy().tobytes()).hexdigest()}
        if self.selection is not None:
            selection["from"] = self.selection
        return replace(self, labels=self.labels[index], items=self.items[index],
                       extras={k: v[index] for k, v in self.extras.items()}, selection=selection)

    def decoded_bytes(self, size: int | None = None, sample: int = 24) -> int:
        """Estimated bytes of the whole set decoded to uint8: N * 3 * size^2 when ``size`` is given (images
        resized), else N * 3 * the mean pixel count of ``sample`` images spread over the set (headers only)."""
        if size is not None:
            return len(self) * 3 * size * size
        picks = torch.linspace(0, len(self) - 1, min(sample, len(self))).round().long().unique()
        pixels = [math.prod(image_header_size(*self.read(int(i)))) for i in picks]
        return int(len(self) * 3 * sum(pixels) / max(len(pixels), 1))

    def materialize(self, size: int | View | None, *, mixed_size: int | View | None = None) -> ImageDataset:
        """The whole set decoded into memory (an ``ImageDataset``): with ``size`` every image is its evaluation view
        (a ``View``, or the side of ``eval_view(image, size, crop_pct, interpolation)``, the pixels ``images_at``
        gives) and its boxes follow it; without it images keep their pixels when they share one size, are viewed at
        ``mixed_size`` (a side or a ``View``) when they differ, and are refused without one."""
        decoded = [None] * len(self)

        def load(i: int) -> None:
            decoded[i] = self.decode(i)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(load, range(len(self))))
        originals = [(int(im.shape[-2]), int(im.shape[-1])) for im in decoded]
        side = size if size is not None else (mixed_size if len(set(originals)) > 1 else None)
        if side is None and len(set(originals)) > 1:
            raise mixed_sizes(f"{self.name} images", sorted(set(originals)))
        view = None if side is None else side if isinstance(side, View) else View(int(side), self.crop_pct,
                                                                                  self.interpolation)
        images = decoded if view is None else [view(im) for im in decoded]
        extras = dict(self.extras)
        if "boxes" in extras and view is not None:
            extras["boxes"] = torch.stack([view_boxes(b, hw, view)
                                           for b, hw in zip(extras["boxes"], originals, strict=True)])
        edge = view.size if view is not None else 0
        stacked = torch.stack(images) if images else torch.zeros(0, 3, edge, edge, dtype=torch.uint8)
        return ImageDataset(self.name, self.split, stacked, self.labels, self.classes, self.mean, self.std,
                            self.root, extras, self.selection, view)
