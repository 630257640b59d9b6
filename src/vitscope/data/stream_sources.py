"""Streamed datasets by name: ``open_streamed(name, root, split)`` for the layouts that can stream.

Streamable layouts are unpacked folders: ``imagenet`` (see ``vitscope.data.imagenet``), ``imagefolder`` and the
CIFAR image-folder trees (``<split>/<class>/<image>``), and ``shards`` (WebDataset tars, ``vitscope.data.shards``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vitscope.data.folder_layout import list_image_folder
from vitscope.data.image_trees import FileTree, check_root, is_archive
from vitscope.data.imagenet import imagenet_listing
from vitscope.data.pixels import DEFAULT_INTERPOLATION, check_crop_pct, default_crop_pct
from vitscope.data.shards import shard_listing
from vitscope.data.stream import FileReader, StreamedDataset

IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

STREAMABLE = ("imagenet", "imagefolder", "cifar10", "cifar100", "shards")
DEFAULT_STREAM_SIZE = 224


def _folder_listing(root: Path, split: str) -> tuple[Path, list[str], list[int], list[str], dict]:
    """An image-folder tree's ``split`` as the in-memory loader lists it (``list_image_folder``, after looking
    into a single top folder)."""
    tree = FileTree(root)
    base = root / tree.prefix
    listing = list_image_folder(tree.files(), split, str(base).rstrip("/"), base.name)
    return base, listing.paths, listing.labels, listing.classes, {}


def open_streamed(name: str, root: str | Path | None, split: str, *, image_size: int | None = None,
                  stats: tuple[tuple[float, ...], tuple[float, ...]] = IMAGENET_STATS,
                  crop_pct: float | None = None, interpolation: str = DEFAULT_INTERPOLATION) -> StreamedDataset:
    """A ``StreamedDataset`` of ``split`` ('train' or 'eval') of an unpacked folder ``root``; ``image_size`` is
    the side of evaluation views and supervised inputs (default 224), ``crop_pct`` the views' crop fraction
    (default: 0.875 for ImageNet's layouts, else 1) and ``interpolation`` their resampling (bilinear or bicubic),
    ``stats`` the normalisation (mean, std)."""
    if name not in STREAMABLE:
        raise ValueError(f"dataset {name} cannot stream; stream: true works for {', '.join(STREAMABLE)} "
                         "(unpacked folders); use stream: false or auto")
    if root is None:
        raise ValueError(f"dataset {name} needs a data directory; pass --data-dir PATH (an unpacked folder)")
    root = Path(root).expanduser()
    check_root(root, f"the {name} folder")
    if is_archive(root) or not root.is_dir():
        raise ValueError(f"{root} is not a folder; streaming reads unpacked folders (or shards), so unpack it "
                         "(tar xf / unzip) and pass the folder, or use stream: false to decode the archive into "
                         "memory")
    mean, std = stats
    size = image_size or DEFAULT_STREAM_SIZE
    if name == "shards":
        reader, labels, classes = shard_listing(root, split)
        extras: dict = {}
    else:
        base, paths, labels, classes, extras = (imagenet_listing(root, split) if name == "imagenet"
                                                else _folder_listing(root, split))
        reader = FileReader(base, tuple(paths))
    crop_pct = check_crop_pct(default_crop_pct(name) if crop_pct is None else crop_pct)
    return StreamedDataset(name, split, reader, torch.tensor(labels, dtype=torch.long), classes, mean, std, size,
                           str(root), extras, crop_pct=crop_pct, interpolation=interpolation)
