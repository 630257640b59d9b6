"""Datasets read from disk image by image (``StreamedDataset``), for sets too large to decode into memory.

A streamed set holds only its labels, class names and a reader (image files, or samples in WebDataset tar
shards); images are decoded on demand with torchvision's decoders, normally in DataLoader worker processes
(``vitscope.data.worker_crops``). Random access by index keeps the training engine's data order, so a streamed
run visits images in the order an in-memory run would, and resumes mid-epoch at the same place.
"""

from __future__ import annotations

import hashlib
import io
import math
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from PIL import Image
from torch import Tensor
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2.functional import center_crop, resize

from vitscope.data.dataset import ImageDataset, stratified_indices

EVAL_CROP_FRACTION = 0.875  # evaluation views: shorter side resized to size / 0.875, then a centre crop (224 of 256)


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


def decode_rgb(data: bytes, where: str) -> Tensor:
    """Encoded JPEG / PNG / WebP / GIF bytes -> uint8 RGB (3, H, W) with torchvision's decoders (EXIF
    orientation applied); an undecodable file raises a ValueError naming ``where``."""
    try:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        with warnings.catch_warnings():  # torchvision 0.29 points to TorchCodec; its decoders work as before
            warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
            return decode_image(buffer, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"cannot decode image {where}: {err}; re-create or remove this file") from None


def image_header_size(data: bytes, where: str = "(bytes)") -> tuple[int, int]:
    """(height, width) of encoded image bytes, read from the header only; a file that is no image raises a
    ValueError naming ``where``."""
    try:
        with Image.open(io.BytesIO(data)) as handle:
            return handle.height, handle.width
    except (OSError, ValueError):  # PIL's UnidentifiedImageError names only its in-memory buffer
        raise ValueError(f"cannot decode image {where}: not a readable image file; re-create or remove this "
                         "file") from None


def eval_view(image: Tensor, size: int) -> Tensor:
    """uint8 (3, H, W) -> (3, size, size): an image of that size as it is (as the in-memory path evaluates it),
    any other with its shorter side resized to ``size / 0.875`` (antialiased) and a centre crop (the usual
    ImageNet evaluation transform, e.g. 256 -> 224)."""
    if tuple(image.shape[-2:]) == (size, size):
        return image
    short = round(size / EVAL_CROP_FRACTION)
    if min(image.shape[-2:]) != short:
        image = resize(image, [short], antialias=True)
    return center_crop(image, [size, size])


@dataclass
class StreamedDataset:
    """A labelled image set decoded on demand.

    ``labels`` int64 (N,); ``reader`` the encoded images, addressed through ``items`` (N,) (the positions of
    this set's images in the reader, so subsets share the reader); ``image_size`` the side in pixels of the
    evaluation views (``images_at``) and of supervised training inputs; ``extras`` per-image targets such as
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

    def __post_init__(self) -> None:
        if self.items is None:
            self.items = torch.arange(len(self.reader))
        if len(self.labels) != len(self.items):
            raise ValueError(f"{len(self.items)} images but {len(self.labels)} labels")
        if self.image_size < 1:
            raise ValueError(f"image_size={self.image_size} must be >= 1 (pixels)")

    def __len__(self) -> int:
        return len(self.labels)

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
            views = list(pool.map(lambda i: eval_view(self.decode(int(i)), self.image_size), index.tolist()))
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

    def materialize(self, size: int | None) -> ImageDataset:
        """The whole set decoded into memory (an ``ImageDataset``), every image resized to ``size`` x ``size``
        (boxes scaled with it); without ``size`` all images must share one size."""
        def load(i: int) -> tuple[Tensor, tuple[int, int]]:
            image = self.decode(i)
            original = (image.shape[-2], image.shape[-1])
            return (image if size is None else resize(image, [size, size], antialias=True)), original

        with ThreadPoolExecutor(max_workers=4) as pool:
            decoded = list(pool.map(load, range(len(self))))
        images = [image for image, _ in decoded]
        originals = [original for _, original in decoded]
        shapes = {tuple(im.shape) for im in images}
        if len(shapes) > 1:
            raise ValueError(f"{self.name} images have different sizes {sorted(shapes)[:3]}; set an image size "
                             "to resize them, e.g. --set dataset_options.image_size=224")
        extras = dict(self.extras)
        if "boxes" in extras and size is not None:
            scale = torch.tensor([[size / w, size / h, size / w, size / h] for h, w in originals])
            extras["boxes"] = extras["boxes"] * scale[:, None, :]
        stacked = torch.stack(images) if images else torch.zeros(0, 3, size or 0, size or 0, dtype=torch.uint8)
        return ImageDataset(self.name, self.split, stacked, self.labels, self.classes, self.mean, self.std,
                            self.root, extras, self.selection)
