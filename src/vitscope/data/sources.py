"""One entry point for every dataset: ``load_dataset(name, root, split)``.

Supported layouts (a folder, or a .zip / .tar / .tar.gz holding one):

* ``cifar10`` / ``cifar100``: torchvision's pickles (``cifar-10-batches-py``, ``cifar-100-python``) or an
  image-folder tree ``train/<class>/*.jpg`` and ``test/<class>/*.jpg``;
* ``tiny-imagenet``: the official ``tiny-imagenet-200`` layout (boxes kept in ``extras["boxes"]``);
* ``imagefolder``: ``<split>/<class>/*`` (``train``; ``test`` or ``val`` for eval), or ``<class>/*`` and a flat
  folder of images, which are evaluation sets only (``vitscope.data.folder_layout``);
* ``imagenet``: ImageNet's folder layout (``vitscope.data.imagenet``) and ``shards``: WebDataset tar shards
  (``vitscope.data.shards``), decoded here when they fit in memory (``image_size`` resizes them) and otherwise
  streamed (``vitscope.data.choice``, ``vitscope.data.stream_sources``);
* ``synthetic``: the generated scenes (no directory).

Decoded images are cached as uint8 tensors (safetensors) in ``$VITSCOPE_CACHE/datasets`` (default
``~/.cache/vitscope``), keyed by the path, size and modification time of every file of the tree (or of the
archive), so no image is decoded twice and an edited tree is decoded afresh.

Images keep their own pixels unless a view is asked for: ``view=model`` (the model's own transform,
``vitscope.data.pixels.model_view``), a size (``image_size``: the view no model named, shorter side resized, centre
crop), or, when they differ in size, the view they are brought to (``mixed_size``, e.g. the model's); then each image
becomes that view (``vitscope.data.pixels.View``), the same pixels the streamed datasets give.
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

from vitscope.atomic_io import atomic_path
from vitscope.cache_dir import cache_root
from vitscope.data.dataset import ImageDataset
from vitscope.data.folder_layout import list_image_folder
from vitscope.data.image_trees import FileTree, check_root, decode_images, fingerprint
from vitscope.data.pixels import (
    DEFAULT_INTERPOLATION,
    View,
    check_crop_pct,
    check_interpolation,
    default_crop_pct,
    model_normalization,
    model_view,
)
from vitscope.data.stream_sources import open_streamed
from vitscope.data.synthetic import synthetic_scenes

DATASETS = ("cifar10", "cifar100", "tiny-imagenet", "imagefolder", "imagenet", "shards", "synthetic")
_SPLIT_ALIASES = {"train": "train", "eval": "eval", "test": "eval", "val": "eval", "validation": "eval"}
_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_CLASS_COUNTS = {"cifar10": 10, "cifar100": 100, "tiny-imagenet": 200}
_CACHE_VERSION = 2


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


def _cache_path(name: str, split: str, digest: str, view: list) -> Path:
    """The decoded copy of ``split``, keyed by ``digest`` (``fingerprint`` of every file below the root, or the
    archive's size and mtime: a changed, added or removed file gives a new key, so a stale copy is never read)
    and ``view``: ``[None]`` for images at their own size, ``[size, crop_pct]`` or ``["mixed", size, crop_pct]``
    for evaluation views."""
    key = json.dumps([_CACHE_VERSION, name, split, digest, *view])
    return cache_dir() / f"{name}-{split}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.safetensors"


def _image_folder(tree: FileTree, split: str, view: dict[str, Any]):
    """Images, labels, classes and extras of ``split`` of an image-folder tree (``list_image_folder``)."""
    where = f"{tree.root}/{tree.prefix}".rstrip("/")
    name = Path(tree.prefix.rstrip("/")).name or tree.root.name.split(".")[0]
    listing = list_image_folder(tree.files(), split, where, name)
    return decode_images(tree, listing.paths, **view), torch.tensor(listing.labels), listing.classes, {}


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


def _tiny_imagenet(tree: FileTree, split: str, view: dict[str, Any]):
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
    if view["size"] is not None:
        raise ValueError("tiny-imagenet keeps its 64 x 64 images in memory (its boxes are in those pixels); drop "
                         "the image size, models are fed resized views of them")
    images = decode_images(tree, paths)
    return images, torch.tensor(labels), wnids, {"boxes": torch.tensor(boxes, dtype=torch.float32)}


def _read(name: str, tree: FileTree, split: str, view: dict[str, Any]):
    if name in ("cifar10", "cifar100"):
        pickled = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
        marker = "test_batch" if name == "cifar10" else "meta"
        if tree.exists(pickled + "/") or tree.exists(marker):
            images, labels, classes, extras = _cifar_pickles(tree, name, split)
            viewed = images if view["size"] is None else view["size"](images)
            return viewed, labels, classes, extras
    if name == "tiny-imagenet":
        return _tiny_imagenet(tree, split, view)
    return _image_folder(tree, split, view)


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


def _cached_decode(name: str, root: Path, split: str, view: dict[str, Any]):
    """(tensors, classes) of ``split``, from the decode cache or decoded now and stored. ``view`` holds ``size``
    and ``mixed_size``, each a ``View`` or None. Without a fixed size a tree whose images share one size is stored
    at that size, whatever ``mixed_size`` says (one copy for every model), and a tree of mixed sizes under its
    views at ``mixed_size``."""
    digest = fingerprint(root)
    if view["size"] is not None:
        keys = [view["size"].key()]
    else:
        keys = [[None]] + ([["mixed", *view["mixed_size"].key()]] if view["mixed_size"] else [])
    for key in keys:
        cached = _cache_path(name, split, digest, key)
        if cached.is_file():
            with safe_open(str(cached), framework="pt") as handle:
                tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
                return tensors, json.loads(handle.metadata()["classes"]), key is not keys[0]
    images, labels, classes, extras = _read(name, FileTree(root), split, view)
    expected = _CLASS_COUNTS.get(name)
    if expected is not None and len(classes) != expected:
        raise ValueError(f"{root} has {len(classes)} classes but {name} has {expected}; "
                         f"check the folder, or use --dataset imagefolder for other class sets")
    tensors = {"images": images.contiguous(), "labels": labels.long(), **extras}
    # a mixed tree comes back viewed at mixed_size, and so does one of a single size at the view's side (stored
    # under the mixed key, decoded once more for another model size); one of another single size kept its pixels
    mixed = view["mixed_size"]
    viewed = mixed is not None and tuple(images.shape[-2:]) == (mixed.size,) * 2
    key = keys[-1] if view["size"] is not None or viewed else keys[0]
    with atomic_path(_cache_path(name, split, digest, key)) as tmp:
        save_file(tensors, str(tmp), metadata={"classes": json.dumps(classes)})
    return tensors, classes, key is not keys[0]


def load_dataset(name: str, root: str | Path | None = None, split: str = "train", *, image_size: int | None = None,
                 crop_pct: float | None = None, mixed_size: int | View | None = None,
                 interpolation: str = DEFAULT_INTERPOLATION, view: Any = None, download: bool = False,
                 **options: Any) -> ImageDataset:
    """The labelled ``split`` ('train' or 'eval'; 'test' and 'val' accepted) of dataset ``name``.

    Images keep their own pixels, except:

    - ``view=model`` (or a ``vitscope.data.pixels.View``): every image as that model takes it, its own transform
      at its input side (``vitscope.data.pixels.model_view``: timm's eval transform, a transformers image
      processor's, OpenCLIP's preprocess), normalised later with the model's mean and std (the dataset's
      ``mean``, ``std``): the pixels ``vitscope analyze`` and the other commands feed the model;
    - ``image_size`` gives every image the view no model named at that side (shorter side resized to
      ``image_size / crop_pct`` with ``interpolation``, centre crop; ``vitscope.data.pixels.eval_view``);
    - ``mixed_size`` (a side, or a model's ``View``) views images only when they differ in size (a folder of
      photos), or share the view's side; the commands pass the model's view and feed other images through it.

    ``crop_pct`` defaults to the dataset's (0.875 for ImageNet's layouts, else 1); ``interpolation`` is the views'
    resampling (bilinear, or bicubic as most pretrained timm models name). The returned set's ``view`` is the view
    its images already are. ``download`` fetches CIFAR into ``root`` when it is missing (and is otherwise ignored:
    the CLI's --download also fetches model weights). ``options`` go to the synthetic generator (``num_images``,
    ``image_size``, ``num_classes``, ``seed``).
    """
    split = canonical_split(split)
    missing = root is None or not Path(root).expanduser().exists()  # (generated scenes need nothing fetched)
    if download and missing and name not in ("cifar10", "cifar100", "synthetic"):
        raise ValueError(f"--download fetches cifar10 and cifar100, not {name}; put {name} in --data-dir yourself")
    if view is not None:
        given = [k for k, v in (("image_size", image_size), ("crop_pct", crop_pct), ("mixed_size", mixed_size),
                                ("interpolation", interpolation if interpolation != DEFAULT_INTERPOLATION else None))
                 if v is not None]
        if given:
            raise ValueError(f"view= sets the size, crop and interpolation of the images; drop {', '.join(given)}")
        if name == "synthetic":
            raise ValueError("view= applies to image files; synthetic scenes are drawn at image_size=S (their boxes "
                             "and masks in those pixels), and a model views them when fed "
                             "(vitscope.analyze.inputs.model_batches)")
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
    if download and name in ("cifar10", "cifar100"):
        _download(name, root)
    check_root(root, f"the {name} folder or archive")
    crop_pct = check_crop_pct(default_crop_pct(name) if crop_pct is None else crop_pct)
    check_interpolation(interpolation)
    mean, std = _STATS.get(name, _IMAGENET_STATS)
    if view is not None:
        sized = view if isinstance(view, View) else model_view(view, name)
        mean, std = (mean, std) if isinstance(view, View) else model_normalization(view, mean, std)
    else:
        sized = None if image_size is None else View(image_size, crop_pct, interpolation)
    mixed = mixed_size if mixed_size is None or isinstance(mixed_size, View) else View(mixed_size, crop_pct,
                                                                                       interpolation)
    if name in ("imagenet", "shards"):
        listing = open_streamed(name, root, split, image_size=image_size, stats=(mean, std), crop_pct=crop_pct,
                                interpolation=interpolation)
        return listing.materialize(sized, mixed_size=mixed)
    tensors, classes, viewed = _cached_decode(name, root, split, {"size": sized, "mixed_size": mixed})
    extras = {k: v for k, v in tensors.items() if k not in ("images", "labels")}
    return ImageDataset(name, split, tensors["images"], tensors["labels"], classes, mean, std, str(root), extras,
                        view=sized or (mixed if viewed else None))
