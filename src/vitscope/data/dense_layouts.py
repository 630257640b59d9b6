"""Dense dataset layouts on disk (folders), read into a ``DenseDataset`` with ``load_dense(name, root, split)``.

Segmentation (``split`` train or eval/val):
* ``voc``: ``VOCdevkit/VOC2012/JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (palette indices),
  ``ImageSets/Segmentation/{train,val}.txt``; 21 classes, 255 ignored.
* ``ade20k``: ``ADEChallengeData2016/images|annotations/{training,validation}/<stem>.jpg|png``; 150 classes.
  Annotation 0 ("other") is ignored and 1..150 become 0..149 (mmseg's reduce_zero_label); ignore index 255.
* ``cityscapes``: ``leftImg8bit/{train,val}/<city>/<stem>_leftImg8bit.png`` and
  ``gtFine/{train,val}/<city>/<stem>_gtFine_labelIds.png``; label ids mapped to the 19 train ids, others 255.
* ``segfolder``: ``images/<split>/<stem>.jpg|png``, ``masks/<split>/<stem>.png`` holding class indices and a
  ``classes.json`` ``{"classes": [...], "ignore_index": 255}`` (split folders ``train`` and ``val``).
Depth:
* ``nyu``: the widely shared CSV layout: ``data/nyu2_train.csv`` / ``data/nyu2_test.csv`` list ``rgb,depth``
  paths relative to the root. Train depth is 8-bit, value / 255 * 10 m; test depth is 16-bit millimetres.
  Depth probes score NYU inside the Eigen crop unless told otherwise (``settings["eigen_crop"]``).
  A file is decoded by its encoding (8-bit or 16-bit), whatever the split.
* ``depthfolder``: ``images/<split>/<stem>.jpg|png`` with ``depth/<split>/<stem>.png`` (8- or 16-bit integers
  times ``scale`` metres, from ``depth.json`` ``{"scale": 0.001}``) or ``<stem>.npy`` (float metres).
Every mask or depth map must match its image in size; a mask value outside the classes that is not the ignore
index is an error naming the file.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitscope.data.dense import DenseDataset, synthetic_dense
from vitscope.data.image_decode import decode_rgb

SEGMENTATION = ("voc", "ade20k", "cityscapes", "segfolder", "synthetic", "synthetic-texture")
DEPTH = ("nyu", "depthfolder", "synthetic", "synthetic-texture")
SYNTHETIC_CUES = {"synthetic": "shape", "synthetic-texture": "texture"}  # built-in scenes by name
VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")
CITYSCAPES_CLASSES = ("road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
                      "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle",
                      "bicycle")
CITYSCAPES_TRAIN_IDS = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12,
                        26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}
IMAGE_TYPES = (".jpg", ".jpeg", ".png")


def _unreadable(path: Path, what: str, err: BaseException) -> ValueError:
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ValueError(f"{path} cannot be read as {what} ({detail}); replace the file or remove it and its pair")


def read_rgb(path: Path) -> Tensor:
    """An image file as uint8 (3, H, W) RGB through the guarded decoder every other reader uses
    (``vitscope.data.image_decode``: EXIF orientation applied, 16-bit and float images read at 8 bits with a word,
    a cut-short PNG refused before a decoder sees it); a damaged file is a ValueError naming it."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise _unreadable(path, "an image", err) from None
    return decode_rgb(data, str(path)).contiguous()


def _single_channel(path: Path, modes: tuple[str, ...], dtype: type, what: str) -> tuple[np.ndarray | None, str]:
    """(values as ``dtype``, PIL mode) of the image at ``path``; values None when its mode is not in ``modes``."""
    try:
        with Image.open(path) as image:
            mode = image.mode
            return (np.asarray(image).astype(dtype) if mode in modes else None), mode
    except (OSError, ValueError, SyntaxError) as err:  # PIL: UnidentifiedImageError, truncated data
        raise _unreadable(path, what, err) from None


def _indices(path: Path) -> np.ndarray:
    values, mode = _single_channel(path, ("P", "L", "I", "I;16"), np.int64, "a mask image")
    if values is None:
        raise ValueError(f"{path}: mask mode {mode} holds no class indices; save masks as 8-bit "
                         "single-channel or palette PNGs of class indices")
    return values


def _read_spec(path: Path, example: str) -> dict[str, Any]:
    """A layout's JSON file as a dict; bad JSON or another value is a ValueError naming the file and the form."""
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); write "
                         f"{example}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path} holds a {type(spec).__name__}, not an object; write {example}")
    return spec


def _check_labels(mask: np.ndarray, classes: int, ignore: int | None, path: Path) -> Tensor:
    bad = (mask < 0) | (mask >= classes)
    if ignore is not None:
        bad &= mask != ignore
    if bad.any():
        raise ValueError(f"{path}: label value {int(mask[bad][0])} is outside 0..{classes - 1} and not the ignore "
                         f"value {ignore}; fix the mask or classes.json")
    return torch.from_numpy(mask)


def _split(split: str, train: str, evaluation: str) -> str:
    if split == "train":
        return train
    if split in ("eval", "val", "test", "validation"):
        return evaluation
    raise ValueError(f"split {split!r} is unknown; use train or eval")


def _pairs_by_stem(images: Path, targets: Path, target_suffixes: tuple[str, ...]) -> list[tuple[Path, Path]]:
    if not images.is_dir():
        raise ValueError(f"no image folder {images}; see vitscope.data.dense_layouts for the expected layout")
    if not any(p.suffix.lower() in IMAGE_TYPES for p in images.iterdir()):
        raise ValueError(f"no images in {images} (looked for {', '.join(IMAGE_TYPES)}); put this split's images "
                         "there, each with its target")
    pairs = []
    for image in sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_TYPES):
        found = [targets / f"{image.stem}{suffix}" for suffix in target_suffixes]
        found = [p for p in found if p.exists()]
        if not found:
            raise ValueError(f"{image}: no target {targets}/{image.stem}{target_suffixes[0]}; every image needs one")
        pairs.append((image, found[0]))
    return pairs


def sample_pairs(pairs: list, limit: int | None, seed: int) -> tuple[list, dict[str, Any] | None]:
    """A seeded random sample of ``limit`` of ``pairs`` (all when None or larger), kept in listing order, and its
    description for provenance (None when all are kept). The same draw as ``DenseDataset.subset(limit, seed)``:
    a listing grouped by scene (NYU) or city (Cityscapes) yields images from across it, not its first scenes."""
    if limit is None or limit >= len(pairs):
        return pairs, None
    index = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))[:limit].sort().values
    return [pairs[i] for i in index.tolist()], {"count": limit, "of": len(pairs), "seed": seed,
                                                "method": "seeded random"}


def _segmentation(name: str, split: str, pairs: list[tuple[Path, Path]], classes: list[str], ignore: int | None,
                  root: Path, convert=None, limit: int | None = None, seed: int = 0) -> DenseDataset:
    pairs, subset = sample_pairs(pairs, limit, seed)
    images, targets = [], []
    for image_path, mask_path in pairs:
        mask = _indices(mask_path)
        mask = convert(mask) if convert is not None else mask
        images.append(read_rgb(image_path))
        targets.append(_check_labels(mask, len(classes), ignore, mask_path))
    return DenseDataset(name, split, "segmentation", images, targets, list(classes), ignore, root=str(root),
                        files=[str(p) for _, p in pairs], settings={"subset": subset} if subset else {})


def _voc(root: Path, split: str, limit: int | None, seed: int) -> DenseDataset:
    base = root / "VOCdevkit" / "VOC2012" if (root / "VOCdevkit").exists() else root
    listing = base / "ImageSets" / "Segmentation" / f"{_split(split, 'train', 'val')}.txt"
    if not listing.exists():
        raise ValueError(f"no {listing}; expected VOCdevkit/VOC2012/ImageSets/Segmentation/train.txt and val.txt")
    stems = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    pairs = []
    for stem in stems:
        image, mask = base / "JPEGImages" / f"{stem}.jpg", base / "SegmentationClass" / f"{stem}.png"
        if not mask.exists():
            raise ValueError(f"{image}: no mask {mask}; every listed image needs one")
        pairs.append((image, mask))
    return _segmentation("voc", split, pairs, list(VOC_CLASSES), 255, root, limit=limit, seed=seed)


def _ade20k(root: Path, split: str, limit: int | None, seed: int) -> DenseDataset:
    base = root / "ADEChallengeData2016" if (root / "ADEChallengeData2016").exists() else root
    folder = _split(split, "training", "validation")
    pairs = _pairs_by_stem(base / "images" / folder, base / "annotations" / folder, (".png",))

    def reduce_zero_label(mask: np.ndarray) -> np.ndarray:
        return np.where(mask == 0, 255, mask - 1)

    return _segmentation("ade20k", split, pairs, [f"class{i}" for i in range(1, 151)], 255, root,
                         reduce_zero_label, limit, seed)


def _cityscapes(root: Path, split: str, limit: int | None, seed: int) -> DenseDataset:
    folder = _split(split, "train", "val")
    images = sorted((root / "leftImg8bit" / folder).glob("*/*_leftImg8bit.png"))
    if not images:
        raise ValueError(f"no images under {root / 'leftImg8bit' / folder}/<city>/*_leftImg8bit.png")
    pairs = []
    for image in images:
        mask = root / "gtFine" / folder / image.parent.name / image.name.replace("_leftImg8bit.png",
                                                                                 "_gtFine_labelIds.png")
        if not mask.exists():
            raise ValueError(f"{image}: no label file {mask}; every image needs one")
        pairs.append((image, mask))
    table = np.full(256, 255, dtype=np.int64)
    for label_id, train_id in CITYSCAPES_TRAIN_IDS.items():
        table[label_id] = train_id
    return _segmentation("cityscapes", split, pairs, list(CITYSCAPES_CLASSES), 255, root,
                         lambda mask: table[np.clip(mask, 0, 255)], limit, seed)


def _segfolder(root: Path, split: str, limit: int | None, seed: int) -> DenseDataset:
    spec_path = root / "classes.json"
    example = '{"classes": ["road", ...], "ignore_index": 255}'
    if not spec_path.exists():
        raise ValueError(f"no {spec_path}; write {example}")
    spec = _read_spec(spec_path, example)
    classes, ignore = spec.get("classes"), spec.get("ignore_index")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise ValueError(f"{spec_path}: \"classes\" must be a non-empty list of class names (got {classes!r}); "
                         f"write {example}")
    if ignore is not None and (isinstance(ignore, bool) or not isinstance(ignore, int)):
        raise ValueError(f"{spec_path}: \"ignore_index\" must be an integer label value or absent (got {ignore!r}); "
                         f"write {example}")
    folder = _split(split, "train", "val")
    pairs = _pairs_by_stem(root / "images" / folder, root / "masks" / folder, (".png",))
    return _segmentation("segfolder", split, pairs, list(classes), ignore, root, limit=limit, seed=seed)


def _depth_file(path: Path, scale8: float, scale16: float) -> Tensor:
    """Depth in metres from an 8-bit (times ``scale8``) or 16-bit (times ``scale16``) PNG, or a float .npy."""
    if path.suffix == ".npy":
        try:
            depth = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise _unreadable(path, "a .npy depth map", err) from None
        if depth.ndim != 2 or not np.issubdtype(depth.dtype, np.number):
            raise ValueError(f"{path}: a .npy depth map must be a 2-D array of metres, got {depth.dtype} of shape "
                             f"{depth.shape}")
        return torch.from_numpy(depth.astype(np.float32))
    values, mode = _single_channel(path, ("L", "I;16", "I;16B", "I"), np.float32, "a depth image")
    if values is None:
        raise ValueError(f"{path}: depth image mode {mode} is neither 8-bit nor 16-bit single-channel; "
                         "store depth as documented in vitscope.data.dense_layouts")
    return torch.from_numpy(values * (scale8 if mode == "L" else scale16))


def _depth(name: str, split: str, pairs: list[tuple[Path, Path]], root: Path, scale8: float, scale16: float,
           limit: int | None, seed: int) -> DenseDataset:
    pairs, subset = sample_pairs(pairs, limit, seed)
    return DenseDataset(name, split, "depth", [read_rgb(i) for i, _ in pairs],
                        [_depth_file(d, scale8, scale16) for _, d in pairs], root=str(root),
                        files=[str(d) for _, d in pairs],
                        settings={"depth_scale": [scale8, scale16]} | ({"subset": subset} if subset else {}))


def _nyu(root: Path, split: str, limit: int | None, seed: int) -> DenseDataset:
    listing = root / "data" / f"nyu2_{_split(split, 'train', 'test')}.csv"
    if not listing.exists():
        raise ValueError(f"no {listing}; expected data/nyu2_train.csv and data/nyu2_test.csv listing rgb,depth paths")
    with open(listing, newline="") as handle:
        rows = [(number, row) for number, row in enumerate(csv.reader(handle), 1) if any(c.strip() for c in row)]
    for number, row in rows:  # a row that is not two paths is an error, never silently dropped
        if len(row) < 2 or not row[0].strip() or not row[1].strip():
            hint = " (it uses ';': separate with a comma)" if ";" in ",".join(row) else ""
            raise ValueError(f"{listing}, line {number}: {','.join(row)!r} is not 'rgb_path,depth_path'{hint}; every "
                             "line lists an image and its depth map, comma-separated")
    if not rows:
        raise ValueError(f"{listing} lists no images; expected lines of 'rgb_path,depth_path'")
    pairs = [(root / row[0].strip(), root / row[1].strip()) for _, row in rows]
    for image, depth in sample_pairs(pairs, limit, seed)[0]:
        if not image.exists() or not depth.exists():
            raise ValueError(f"{listing}: listed file {image if not image.exists() else depth} does not exist")
    data = _depth("nyu", split, pairs, root, 10.0 / 255.0, 1e-3, limit, seed)
    data.settings["eigen_crop"] = True  # NYU's evaluation protocol: scored inside the Eigen crop by default
    return data


def _depthfolder(root: Path, split: str, limit: int | None, seed: int) -> DenseDataset:
    spec = root / "depth.json"
    scale = _read_spec(spec, '{"scale": 0.001}').get("scale") if spec.exists() else None
    if spec.exists() and (isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < math.inf):
        raise ValueError(f"{spec}: \"scale\" must be a number of metres per stored unit > 0 (got {scale!r}); e.g. "
                         '{"scale": 0.001} for millimetres')
    folder = _split(split, "train", "val")
    pairs = _pairs_by_stem(root / "images" / folder, root / "depth" / folder, (".png", ".npy"))
    if scale is None and any(d.suffix == ".png" for _, d in pairs):
        raise ValueError(f"no {spec}; PNG depth needs its scale: write {{\"scale\": 0.001}} (metres per unit)")
    return _depth("depthfolder", split, pairs, root, scale or 1.0, scale or 1.0, limit, seed)


_LOADERS = {"voc": _voc, "ade20k": _ade20k, "cityscapes": _cityscapes, "segfolder": _segfolder, "nyu": _nyu,
            "depthfolder": _depthfolder}


def load_dense(name: str, root: str | Path | None, split: str, *, task: str = "segmentation",
               limit: int | None = None, seed: int = 0, synthetic_images: int | None = None) -> DenseDataset:
    """A dense dataset by ``--dataset`` name; ``synthetic`` (shape scenes) and ``synthetic-texture`` (the texture
    scenes the DINO demos train on) need no root and serve either ``task``. ``limit`` images are a seeded random
    sample (``seed``) of the split, described in ``settings["subset"]``."""
    if name in SYNTHETIC_CUES:
        count = synthetic_images or (256 if split == "train" else 64)
        return synthetic_dense(task, "train" if split == "train" else "eval", count, cue=SYNTHETIC_CUES[name])
    names = SEGMENTATION if task == "segmentation" else DEPTH
    if name not in _LOADERS or name not in names:
        raise ValueError(f"dataset {name!r} has no {task} layout; use one of {', '.join(names)}")
    if root is None or not Path(root).is_dir():
        raise ValueError(f"--data-dir {root} is not a folder; {name} reads an unpacked folder "
                         "(see vitscope.data.dense_layouts)")
    return _LOADERS[name](Path(root), split, limit, seed)
