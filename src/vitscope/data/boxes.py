"""Images with object boxes from PASCAL-VOC-style XML (VOC detection, ImageNet validation), for Point-in-Box.

Layouts (folders):
* ``voc``: ``VOCdevkit/VOC2012/JPEGImages/<id>.jpg``, ``Annotations/<id>.xml``, ``ImageSets/Main/{train,val}.txt``;
  20 classes; an image's label is the class of its largest box.
* ``imagenet``: validation images ``val/<name>.JPEG`` (flat or inside class folders) with one XML per image,
  ``val/<name>.xml`` beside it or ``bbox_val/<name>.xml`` (as ``ILSVRC2012_bbox_val`` unpacks); the label is the
  largest box's synset among the sorted synsets of the annotations.
XML boxes are 1-based inclusive pixel indices (xmin..xmax); they become pixel edges x0 = xmin - 1, x1 = xmax.
Images become their evaluation view at ``image_size`` (``vitscope.data.pixels.eval_view``: shorter side resized
to ``image_size / crop_pct``, centre crop, never stretched) and their boxes move with them (a box cut away
entirely becomes a NaN row); ``extras["boxes"]`` is (N, K, 4) with NaN rows padding images that have fewer than
K boxes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from vitscope.data.dataset import ImageDataset
from vitscope.data.dense import IMAGENET_MEAN, IMAGENET_STD
from vitscope.data.dense_layouts import VOC_CLASSES, read_rgb
from vitscope.data.pixels import DEFAULT_CROP_PCT, eval_view, view_boxes

BOX_DATASETS = ("voc", "imagenet")


def read_xml_boxes(path: Path) -> tuple[list[str], torch.Tensor]:
    """Object names and boxes (K, 4) as pixel edges x0, y0, x1, y1 from one VOC-style XML file."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"{path}: not a readable annotation XML ({err})") from None
    names, boxes = [], []
    for obj in root.iter("object"):
        box = obj.find("bndbox")
        if box is None:
            continue
        xmin, ymin, xmax, ymax = (float(box.findtext(key)) for key in ("xmin", "ymin", "xmax", "ymax"))
        names.append(obj.findtext("name").strip())
        boxes.append([xmin - 1, ymin - 1, xmax, ymax])
    if not boxes:
        raise ValueError(f"{path}: no <object><bndbox> in this annotation; every image needs at least one box")
    return names, torch.tensor(boxes, dtype=torch.float32)


def _dataset(name: str, split: str, items: list[tuple[Path, Path]], classes: list[str], root: Path,
             image_size: int, limit: int | None, crop_pct: float = DEFAULT_CROP_PCT) -> ImageDataset:
    images, labels, boxes = [], [], []
    for image_path, xml_path in items[:limit]:
        names, found = read_xml_boxes(xml_path)
        image = read_rgb(image_path)
        height, width = image.shape[-2:]
        areas = (found[:, 2] - found[:, 0]) * (found[:, 3] - found[:, 1])
        largest = names[int(areas.argmax())]
        if largest not in classes:
            raise ValueError(f"{xml_path}: object class {largest!r} is not one of the dataset's classes")
        labels.append(classes.index(largest))
        moved = view_boxes(found, (height, width), image_size, crop_pct)
        moved[(moved[:, 2] <= moved[:, 0]) | (moved[:, 3] <= moved[:, 1])] = float("nan")  # cut away by the crop
        boxes.append(moved)
        images.append(eval_view(image, image_size, crop_pct))
    most = max((len(b) for b in boxes), default=1)
    padded = torch.full((len(boxes), most, 4), float("nan"))
    for i, b in enumerate(boxes):
        padded[i, : len(b)] = b
    return ImageDataset(name, split, torch.stack(images) if images else torch.zeros(0, 3, image_size, image_size,
                                                                                    dtype=torch.uint8),
                        torch.tensor(labels, dtype=torch.long), classes, IMAGENET_MEAN, IMAGENET_STD, str(root),
                        {"boxes": padded})


def _voc(root: Path, split: str, image_size: int, limit: int | None) -> ImageDataset:
    base = root / "VOCdevkit" / "VOC2012" if (root / "VOCdevkit").exists() else root
    listing = base / "ImageSets" / "Main" / f"{'train' if split == 'train' else 'val'}.txt"
    if not listing.exists():
        raise ValueError(f"no {listing}; expected VOCdevkit/VOC2012/ImageSets/Main/train.txt and val.txt")
    items = []
    for stem in (line.split()[0] for line in listing.read_text().splitlines() if line.strip()):
        xml = base / "Annotations" / f"{stem}.xml"
        if not xml.exists():
            raise ValueError(f"{base / 'JPEGImages' / stem}.jpg: no annotation {xml}")
        items.append((base / "JPEGImages" / f"{stem}.jpg", xml))
    return _dataset("voc", split, items, list(VOC_CLASSES[1:]), root, image_size, limit)


def _imagenet(root: Path, split: str, image_size: int, limit: int | None) -> ImageDataset:
    if split == "train":
        raise ValueError("imagenet boxes are read for the validation split only; use split eval")
    images = sorted(p for p in (root / "val").rglob("*") if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
    if not images:
        raise ValueError(f"no validation images under {root / 'val'}")
    items = []
    for image in images:
        candidates = [image.with_suffix(".xml"), root / "bbox_val" / f"{image.stem}.xml"]
        found = [c for c in candidates if c.exists()]
        if not found:
            raise ValueError(f"{image}: no annotation {candidates[0]} or {candidates[1]}")
        items.append((image, found[0]))
    synsets = sorted({name for _, xml in items[:limit] for name in read_xml_boxes(xml)[0]})
    return _dataset("imagenet", "eval", items, synsets, root, image_size, limit)


def load_box_dataset(name: str, root: str | Path | None, split: str, *, image_size: int = 224,
                     limit: int | None = None) -> ImageDataset:
    """Images with boxes from the ``voc`` or ``imagenet`` layout (see the module docstring)."""
    if name not in BOX_DATASETS:
        raise ValueError(f"{name!r} has no box layout; use {', '.join(BOX_DATASETS)}")
    if root is None or not Path(root).is_dir():
        raise ValueError(f"--data-dir {root} is not a folder; {name} boxes are read from an unpacked folder")
    loader = _voc if name == "voc" else _imagenet
    return loader(Path(root), "train" if split == "train" else "eval", image_size, limit)
