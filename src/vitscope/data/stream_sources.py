"""Streamed datasets by name: ``open_streamed(name, root, split)`` for the layouts that can stream.

Streamable layouts are unpacked folders: ``imagenet`` (see ``vitscope.data.imagenet``), ``imagefolder`` and the
CIFAR image-folder trees (``<split>/<class>/<image>``), and ``shards`` (WebDataset tars, ``vitscope.data.shards``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vitscope.data.files import SPLIT_FOLDERS, is_archive
from vitscope.data.imagenet import class_folders, imagenet_listing
from vitscope.data.shards import shard_listing
from vitscope.data.stream import FileReader, StreamedDataset

IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

STREAMABLE = ("imagenet", "imagefolder", "cifar10", "cifar100", "shards")
DEFAULT_STREAM_SIZE = 224
_FOLDER_HELP = "expected <root>/train/<class>/<image> and <root>/val/<class>/<image> (or test/)"


def _descend(root: Path) -> Path:
    """Look into a folder whose only entry is a folder (not a split folder), as the in-memory loader does."""
    while True:
        entries = [p for p in root.iterdir() if not p.name.startswith(".")]
        if len(entries) != 1 or not entries[0].is_dir() or entries[0].name in SPLIT_FOLDERS:
            return root
        root = entries[0]


def _folder_listing(root: Path, split: str) -> tuple[Path, list[str], list[int], list[str], dict]:
    names = ("train",) if split == "train" else ("test", "val", "eval")
    for name in names:
        if (root / name).is_dir():
            paths, labels, classes = class_folders(root / name)
            if not paths:
                raise ValueError(f"no images under {root / name}/<class>/; {_FOLDER_HELP}")
            return root, paths, labels, classes, {}
    raise ValueError(f"no {' or '.join(n + '/' for n in names)} folder in {root}; {_FOLDER_HELP}")


def open_streamed(name: str, root: str | Path | None, split: str, *, image_size: int | None = None,
                  stats: tuple[tuple[float, ...], tuple[float, ...]] = IMAGENET_STATS) -> StreamedDataset:
    """A ``StreamedDataset`` of ``split`` ('train' or 'eval') of an unpacked folder ``root``; ``image_size`` is
    the side of evaluation views and supervised inputs (default 224), ``stats`` the normalisation (mean, std)."""
    if name not in STREAMABLE:
        raise ValueError(f"dataset {name} cannot stream; stream: true works for {', '.join(STREAMABLE)} "
                         "(unpacked folders); use stream: false or auto")
    if root is None:
        raise ValueError(f"dataset {name} needs a data directory; pass --data-dir PATH (an unpacked folder)")
    root = Path(root).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"data directory {root} does not exist; pass --data-dir with the {name} folder")
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
                                                else _folder_listing(_descend(root), split))
        reader = FileReader(base, tuple(paths))
    return StreamedDataset(name, split, reader, torch.tensor(labels, dtype=torch.long), classes, mean, std, size,
                           str(root), extras)
