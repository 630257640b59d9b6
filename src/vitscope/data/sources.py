"""One entry point for every dataset: ``load_dataset(name, root, split)``.

Supported layouts (a folder, or a .zip / .tar / .tar.gz holding one):

* ``cifar10`` / ``cifar100``: torchvision's pickles (``cifar-10-batches-py``, ``cifar-100-python``) or an
  image-folder tree ``train/<class>/*.jpg`` and ``test/<class>/*.jpg``;
* ``tiny-imagenet``: the official ``tiny-imagenet-200`` layout (boxes kept in ``extras["boxes"]``);
* ``imagefolder``: any ``<split>/<class>/*`` tree (``train``; ``test`` or ``val`` for eval);
* ``imagenet``: ImageNet's folder layout (``vitscope.data.imagenet``) and ``shards``: WebDataset tar shards
  (``vitscope.data.shards``), decoded here when they fit in memory (``image_size`` resizes them) and otherwise
  streamed (``vitscope.data.choice``, ``vitscope.data.stream_sources``);
* ``synthetic``: the generated scenes (no directory).

Decoded images are cached as uint8 tensors (safetensors) in ``$VITSCOPE_CACHE/datasets`` (default
``~/.cache/vitscope``), keyed by the path, size and modification time of every file of the tree (or of the
archive), so no image is decoded twice and an edited tree is decoded afresh.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vitscope.data.dataset import ImageDataset, sample_record, stratified_indices
from vitscope.data.files import IMAGE_SUFFIXES, FileTree, decode_images, fingerprint
from vitscope.data.stream_sources import open_streamed
from vitscope.data.synthetic import synthetic_scenes
from vitscope.files import atomic_path, cache_root

DATASETS = ("cifar10", "cifar100", "tiny-imagenet", "imagefolder", "imagenet", "shards", "synthetic")
_SPLIT_ALIASES = {"train": "train", "eval": "eval", "test": "eval", "val": "eval", "validation": "eval"}
_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_CLASS_COUNTS = {"cifar10": 10, "cifar100": 100, "tiny-imagenet": 200}
_CACHE_VERSION = 2
_FOLDER_HELP = "expected <root>/train/<class>/<image> and <root>/test/<class>/<image> (or val/)"


def dataset_stats(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) in [0, 1] units used to normalise ``name``'s images (ImageNet's by default)."""
    return _STATS.get(name, _IMAGENET_STATS)


def canonical_split(split: str) -> str:
    """'train' or 'eval' from a split name (native names 'test' and 'val' mean 'eval')."""
    if split not in _SPLIT_ALIASES:
        raise ValueError(f"split {split!r} is unknown; use 'train' or 'eval' (or the native 'test' / 'val')")
    return _SPLIT_ALIASES[split]


def cache_dir() -> Path:
    return cache_root() / "datasets"


def _cache_path(name: str, split: str, root: Path, image_size: int | None) -> Path:
    """The decoded copy of ``split``, keyed by every file below ``root`` (or the archive's size and mtime):
    a changed, added or removed file gives a new key, so a stale copy is never read."""
    key = json.dumps([_CACHE_VERSION, name, split, fingerprint(root), image_size])
    return cache_dir() / f"{name}-{split}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.safetensors"


def _image_listing(tree: FileTree, split_dir: str) -> tuple[list[str], torch.Tensor, list[str]]:
    """The image paths of ``split_dir/<class>/...`` in sorted order, their labels (N,) and the class names,
    from the file names alone (nothing is decoded)."""
    entries = [f for f in tree.files(split_dir + "/") if Path(f).suffix.lower() in IMAGE_SUFFIXES]
    entries = [f for f in entries if f.count("/") >= 2]
    classes = sorted({f.split("/")[1] for f in entries})
    if not classes:
        where = f"{tree.root}/{tree.prefix}{split_dir}"
        raise ValueError(f"no images under {where}; {_FOLDER_HELP}; found: {tree.describe()}")
    index = {c: i for i, c in enumerate(classes)}
    return entries, torch.tensor([index[f.split("/")[1]] for f in entries], dtype=torch.long), classes


def _image_folder(tree: FileTree, split_dir: str, size: int | None):
    entries, labels, classes = _image_listing(tree, split_dir)
    return decode_images(tree, entries, size), labels, classes, {}


def _eval_dir(tree: FileTree) -> str:
    for candidate in ("test", "val", "eval"):
        if tree.exists(candidate + "/"):
            return candidate
    raise ValueError(f"no test/ or val/ folder in {tree.root}; {_FOLDER_HELP}; found: {tree.describe()}")


def _cifar_pickles(tree: FileTree, name: str, split: str):
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    base = folder + "/" if tree.exists(folder + "/") else ""
    if name == "cifar10":
        parts = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        meta_file, label_key, names_key = "batches.meta", b"labels", b"label_names"
    else:
        parts = ["train"] if split == "train" else ["test"]
        meta_file, label_key, names_key = "meta", b"fine_labels", b"fine_label_names"
    chunks = [pickle.loads(tree.read(base + p), encoding="bytes") for p in parts]
    data = np.concatenate([c[b"data"] for c in chunks]).reshape(-1, 3, 32, 32)
    labels = torch.tensor(np.concatenate([c[label_key] for c in chunks]), dtype=torch.long)
    classes = [n.decode() for n in pickle.loads(tree.read(base + meta_file), encoding="bytes")[names_key]]
    return torch.from_numpy(data.copy()), labels, classes, {}


def _tiny_imagenet(tree: FileTree, split: str, size: int | None):
    base = "tiny-imagenet-200/" if tree.exists("tiny-imagenet-200/") else ""
    if not tree.exists(base + "wnids.txt"):
        raise ValueError(f"no wnids.txt in {tree.root}; expected the tiny-imagenet-200 layout "
                         "(wnids.txt, train/<wnid>/images/*.JPEG, val/images + val/val_annotations.txt)")
    wnids = tree.read(base + "wnids.txt").decode().split()
    index = {w: i for i, w in enumerate(wnids)}
    paths, labels, boxes = [], [], []
    if split == "train":
        for wnid in wnids:
            table = tree.read(f"{base}train/{wnid}/{wnid}_boxes.txt").decode().splitlines()
            for line in table:
                fname, *box = line.split()
                paths.append(f"{base}train/{wnid}/images/{fname}")
                labels.append(index[wnid])
                boxes.append([float(v) for v in box])
    else:
        for line in tree.read(base + "val/val_annotations.txt").decode().splitlines():
            fname, wnid, *box = line.split()
            paths.append(f"{base}val/images/{fname}")
            labels.append(index[wnid])
            boxes.append([float(v) for v in box])
    images = decode_images(tree, paths, size)
    return images, torch.tensor(labels), wnids, {"boxes": torch.tensor(boxes, dtype=torch.float32)}


def _is_cifar_pickles(name: str, tree: FileTree) -> bool:
    pickled = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    marker = "test_batch" if name == "cifar10" else "meta"
    return tree.exists(pickled + "/") or tree.exists(marker)


def _read(name: str, tree: FileTree, split: str, size: int | None):
    if name in ("cifar10", "cifar100"):
        if _is_cifar_pickles(name, tree):
            return _cifar_pickles(tree, name, split)
        return _image_folder(tree, "train" if split == "train" else _eval_dir(tree), size)
    if name == "tiny-imagenet":
        return _tiny_imagenet(tree, split, size)
    return _image_folder(tree, "train" if split == "train" else _eval_dir(tree), size)


def _download(name: str, root: Path) -> None:
    """Fetch CIFAR with torchvision's downloader (skipped when the files are there and intact); without a
    network, a ValueError at once naming the file to put in ``root`` instead."""
    import socket
    from urllib.parse import urlparse

    import torchvision

    dataset_cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    instead = (f"without a network, put {dataset_cls.filename} (from {dataset_cls.url}) or its extracted "
               f"{dataset_cls.base_folder}/ in {root} and drop --download")
    if not (root / dataset_cls.base_folder).is_dir():
        host = urlparse(dataset_cls.url).hostname
        try:
            socket.create_connection((host, 443), timeout=5).close()
        except OSError as err:
            raise ValueError(f"--download cannot reach {host} ({err.strerror or err}); {instead}") from None
    try:
        for train in (True, False):
            dataset_cls(str(root), train=train, download=True)
    except (OSError, RuntimeError) as err:  # URLError is an OSError
        raise ValueError(f"--download of {name} failed ({err}); {instead}") from None


@functools.lru_cache(maxsize=4)
def _cached_synthetic(split: str, options: tuple) -> ImageDataset:
    """Generated scenes are deterministic, so repeated loads in one process share one copy."""
    return synthetic_scenes(split, **dict(options))


def _check_class_count(name: str, root: Path, classes: list[str]) -> None:
    expected = _CLASS_COUNTS.get(name)
    if expected is not None and len(classes) != expected:
        raise ValueError(f"{root} has {len(classes)} classes but {name} has {expected}; "
                         f"check the folder, or use --dataset imagefolder for other class sets")


def load_dataset(name: str, root: str | Path | None = None, split: str = "train", *, image_size: int | None = None,
                 download: bool = False, **options: Any) -> ImageDataset:
    """The labelled ``split`` ('train' or 'eval'; 'test' and 'val' accepted) of dataset ``name``.

    ``image_size`` resizes decoded images (needed when an image folder mixes sizes); ``options`` go to
    the synthetic generator (``num_images``, ``image_size``, ``num_classes``, ``seed``).
    """
    split = canonical_split(split)
    if download and name not in ("cifar10", "cifar100"):
        raise ValueError(f"--download supports cifar10 and cifar100, not {name}; put {name} in --data-dir yourself")
    if name == "synthetic":
        if image_size is not None:
            options["image_size"] = image_size
        return _cached_synthetic(split, tuple(sorted(options.items())))
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if options:
        raise ValueError(f"options {sorted(options)} apply only to the synthetic dataset")
    if root is None:
        raise ValueError(f"dataset {name} needs a data directory; pass --data-dir PATH (a folder or archive)")
    root = Path(root).expanduser()
    if download:
        _download(name, root)
    if not root.exists():
        raise FileNotFoundError(
            f"data directory {root} does not exist; pass --data-dir with the {name} folder or archive"
        )
    if name in ("imagenet", "shards"):
        listing = open_streamed(name, root, split, image_size=image_size, stats=dataset_stats(name))
        return listing.materialize(image_size)
    cached = _cache_path(name, split, root, image_size)
    mean, std = _STATS.get(name, _IMAGENET_STATS)
    if cached.is_file():
        with safe_open(str(cached), framework="pt") as handle:
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
            classes = json.loads(handle.metadata()["classes"])
    else:
        images, labels, classes, extras = _read(name, FileTree(root), split, image_size)
        _check_class_count(name, root, classes)
        tensors = {"images": images.contiguous(), "labels": labels.long(), **extras}
        with atomic_path(cached) as tmp:
            save_file(tensors, str(tmp), metadata={"classes": json.dumps(classes)})
    extras = {k: v for k, v in tensors.items() if k not in ("images", "labels")}
    return ImageDataset(name, split, tensors["images"], tensors["labels"], classes, mean, std, str(root), extras)


def load_sample(name: str, root: str | Path | None, split: str, count: int | None, seed: int = 0, *,
                image_size: int | None = None, download: bool = False, **options: Any) -> ImageDataset:
    """``load_dataset(name, root, split, ...).subset(count, seed)``, the same images and ``selection``, but an
    image-folder tree (CIFAR as JPEGs, ``imagefolder``) whose split is not decoded yet decodes only the sample:
    the seeded class-stratified draw needs only the labels, which the member names give. A split already in
    the decode cache, another layout, a sample as large as the split, or a ``download`` is loaded whole and
    subset."""
    whole = (name in ("synthetic", "tiny-imagenet", "imagenet", "shards") or root is None or count is None
             or download or name not in DATASETS)
    if not whole:
        split = canonical_split(split)
        root = Path(root).expanduser()
        whole = not root.exists() or _cache_path(name, split, root, image_size).is_file()
    if whole:
        return load_dataset(name, root, split, image_size=image_size, download=download, **options).subset(
            count, seed)
    if options:
        raise ValueError(f"options {sorted(options)} apply only to the synthetic dataset")
    tree = FileTree(root)
    if name in ("cifar10", "cifar100") and _is_cifar_pickles(name, tree):
        return load_dataset(name, root, split, image_size=image_size).subset(count, seed)
    entries, labels, classes = _image_listing(tree, "train" if split == "train" else _eval_dir(tree))
    _check_class_count(name, root, classes)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"subset size {count!r} must be a positive integer (or None for all images)")
    if count >= len(entries):
        return load_dataset(name, root, split, image_size=image_size)
    index = stratified_indices(labels, count, seed)
    images = decode_images(tree, [entries[i] for i in index.tolist()], image_size)
    mean, std = dataset_stats(name)
    return ImageDataset(name, split, images, labels[index], classes, mean, std, str(root), {},
                        sample_record(index, count, len(entries), seed))
