"""ImageNet (ILSVRC-2012 CLS-LOC) in its folder layout, listed for streaming.

Layouts (``root`` is the folder given as ``--data-dir``):

* ``root/train/<wnid>/*.JPEG`` (or Kaggle's ``root/ILSVRC/Data/CLS-LOC/train/...``);
* ``root/val/`` either sorted into ``<wnid>/`` class folders, or flat ``val/*.JPEG`` with labels from
  ``LOC_val_solution.csv`` (in ``root``; rows ``ImageId,PredictionString`` where the string is
  ``wnid x0 y0 x1 y1 wnid ...``, the first wnid being the label);
* boxes of validation images from their VOC-style XML (``val/<name>.xml``, ``bbox_val/<name>.xml`` or Kaggle's
  ``ILSVRC/Annotations/CLS-LOC/val/<name>.xml``), else from the CSV's boxes, as pixel edges in the original
  image; ``extras["boxes"]`` is (N, K, 4) with NaN rows padding.

Class labels are the sorted wnids of ``train/`` (or of ``LOC_synset_mapping.txt`` when there is no train
folder), so both splits share one label numbering.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from vitscope.data.boxes import read_xml_boxes

IMAGENET_SUFFIXES = {".jpeg", ".jpg", ".png"}
LAYOUT_HELP = ("expected ImageNet's layout: train/<wnid>/*.JPEG and val/ (class folders, or flat with "
               "LOC_val_solution.csv in the data directory)")


def _base(root: Path) -> Path:
    kaggle = root / "ILSVRC" / "Data" / "CLS-LOC"
    return kaggle if kaggle.is_dir() else root


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGENET_SUFFIXES)


def class_folders(split_dir: Path) -> tuple[list[str], list[int], list[str]]:
    """Relative image paths, labels and sorted class names of a ``<split_dir>/<class>/<image>`` tree."""
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and _images(p))
    paths, labels = [], []
    for label, name in enumerate(classes):
        for image in _images(split_dir / name):
            paths.append(image.relative_to(split_dir.parent).as_posix())
            labels.append(label)
    return paths, labels, classes


def imagenet_classes(root: Path) -> list[str]:
    base = _base(root)
    if (base / "train").is_dir():
        classes = sorted(p.name for p in (base / "train").iterdir() if p.is_dir())
        if classes:
            return classes
    mapping = root / "LOC_synset_mapping.txt"
    if mapping.is_file():
        return sorted(line.split()[0] for line in mapping.read_text().splitlines() if line.strip())
    raise ValueError(f"no class folders under {base / 'train'} and no {mapping}; {LAYOUT_HELP}")


def _solution(root: Path) -> dict[str, list[str]] | None:
    """ImageId -> the PredictionString's tokens, from LOC_val_solution.csv (None when absent)."""
    path = root / "LOC_val_solution.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and not {"ImageId", "PredictionString"} <= set(rows[0]):
        raise ValueError(f"{path}: expected the columns ImageId,PredictionString, got {', '.join(rows[0])}")
    return {row["ImageId"]: row["PredictionString"].split() for row in rows}


def _xml_boxes(root: Path, image: Path) -> torch.Tensor | None:
    candidates = [image.with_suffix(".xml"), root / "bbox_val" / f"{image.stem}.xml",
                  root / "ILSVRC" / "Annotations" / "CLS-LOC" / "val" / f"{image.stem}.xml"]
    for candidate in candidates:
        if candidate.is_file():
            return read_xml_boxes(candidate)[1]
    return None


def _csv_boxes(tokens: list[str]) -> torch.Tensor:
    """``wnid x0 y0 x1 y1 ...`` -> (K, 4); the CSV gives pixel coordinates as the XML does (1-based)."""
    boxes = [[float(v) for v in tokens[i + 1 : i + 5]] for i in range(0, len(tokens) - 4, 5)]
    return torch.tensor([[x0 - 1, y0 - 1, x1, y1] for x0, y0, x1, y1 in boxes], dtype=torch.float32)


def pad_boxes(boxes: list[torch.Tensor | None]) -> torch.Tensor:
    """Per-image (K_i, 4) boxes (None: no box) -> (N, max K, 4) with NaN rows padding."""
    most = max((len(b) for b in boxes if b is not None), default=1)
    padded = torch.full((len(boxes), most, 4), float("nan"))
    for i, b in enumerate(boxes):
        if b is not None:
            padded[i, : len(b)] = b
    return padded


def imagenet_listing(root: Path, split: str) -> tuple[Path, list[str], list[int], list[str], dict[str, torch.Tensor]]:
    """(folder the paths are relative to, image paths, labels, class names, extras) of ``split``
    ('train' or 'eval'). Errors name the missing path and the expected layout."""
    base = _base(root)
    classes = imagenet_classes(root)
    index = {wnid: i for i, wnid in enumerate(classes)}
    if split == "train":
        paths, labels, found = class_folders(base / "train")
        if not paths:
            raise ValueError(f"no images under {base / 'train'}/<wnid>/; {LAYOUT_HELP}")
        return base, paths, [index[found[label]] for label in labels], classes, {}
    val = base / "val"
    if not val.is_dir():
        raise ValueError(f"no validation folder {val}; {LAYOUT_HELP}")
    if any(p.is_dir() for p in val.iterdir()):
        paths, labels, found = class_folders(val)
        unknown = sorted(set(found) - set(index))
        if unknown:
            raise ValueError(f"{val}: class folders {unknown[:3]} are not among the training classes; "
                             "check that train/ and val/ come from the same release")
        labels = [index[found[label]] for label in labels]
        images = [base / p for p in paths]
    else:
        solution = _solution(root)
        if solution is None:
            raise ValueError(f"{val} holds images without class folders and {root / 'LOC_val_solution.csv'} is "
                             "missing; put LOC_val_solution.csv in the data directory or sort val/ into "
                             "<wnid>/ folders")
        images = _images(val)
        labels = []
        for image in images:
            tokens = solution.get(image.stem)
            if not tokens:
                raise ValueError(f"{image}: no row for {image.stem} in {root / 'LOC_val_solution.csv'}")
            if tokens[0] not in index:
                raise ValueError(f"{image}: class {tokens[0]} from LOC_val_solution.csv is not a training class")
            labels.append(index[tokens[0]])
        paths = [image.relative_to(base).as_posix() for image in images]
    if not images:
        raise ValueError(f"no images under {val}; {LAYOUT_HELP}")
    solution = _solution(root) or {}
    boxes = []
    for image in images:
        found_boxes = _xml_boxes(root, image)
        if found_boxes is None and solution.get(image.stem):
            found_boxes = _csv_boxes(solution[image.stem])
        boxes.append(found_boxes)
    extras = {"boxes": pad_boxes(boxes)} if any(b is not None for b in boxes) else {}
    return base, paths, labels, classes, extras
