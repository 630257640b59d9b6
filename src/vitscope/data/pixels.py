"""The evaluation view of an image: the one place both the in-memory loaders (``sources.py``, ``image_trees.py``)
and the streamed datasets (``stream.py``) turn decoded images (``image_decode.py``) into model-sized pixels.

The view is timm's evaluation transform, done with torchvision v2 (``resize`` + ``center_crop``, antialiased, with
the model's interpolation: bicubic for most pretrained timm ViTs, bilinear where none is named): the shorter side is
resized to ``floor(size / crop_pct)`` and the centre ``size`` x ``size`` is cut, so an image is never stretched.
An image already ``size`` x ``size`` is kept as it is (CIFAR at its native 32 px keeps its pixels), and a square
image at ``crop_pct`` 1 is plainly resized.
"""

from __future__ import annotations

import math

from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2.functional import center_crop, clamp_bounding_boxes, resize

DEFAULT_CROP_PCT = 1.0  # the whole shorter side (only the longer side's excess is cut)
IMAGENET_CROP_PCT = 0.875  # the ImageNet evaluation convention: 224 cut from a 256 shorter side
_CROP_PCT_BY_DATASET = {"imagenet": IMAGENET_CROP_PCT, "shards": IMAGENET_CROP_PCT}
DEFAULT_INTERPOLATION = "bilinear"  # where no model names one (vitscope's own models, datasets read alone)
INTERPOLATIONS = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


def default_crop_pct(dataset: str) -> float:
    """The crop fraction of ``dataset``'s evaluation views when the model names none: 0.875 for ImageNet's
    layouts (``imagenet``, ``shards``), else 1 (the whole shorter side)."""
    return _CROP_PCT_BY_DATASET.get(dataset, DEFAULT_CROP_PCT)


def check_crop_pct(crop_pct: float) -> float:
    """``crop_pct`` if it lies in (0, 1], else a ValueError naming it."""
    if not 0 < float(crop_pct) <= 1:
        raise ValueError(f"crop_pct={crop_pct!r} must lie in (0, 1] (the fraction of the resized shorter side kept)")
    return float(crop_pct)


def check_interpolation(interpolation: str) -> str:
    """``interpolation`` if the views support it (bilinear, bicubic), else a ValueError naming both."""
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation {interpolation!r} is not supported; use {' or '.join(INTERPOLATIONS)}")
    return interpolation


def view_scale_size(size: int, crop_pct: float) -> int:
    """The shorter side (pixels) an image is resized to before its centre ``size`` x ``size`` is cut (timm's
    ``floor(size / crop_pct)``)."""
    return max(size, math.floor(size / check_crop_pct(crop_pct)))


def eval_view(image: Tensor, size: int, crop_pct: float = DEFAULT_CROP_PCT,
              interpolation: str = DEFAULT_INTERPOLATION) -> Tensor:
    """uint8 (..., 3, H, W) -> (..., 3, size, size): kept as it is when already size x size, else the shorter side
    resized to ``view_scale_size(size, crop_pct)`` (``interpolation``, antialiased) and the centre size x size cut."""
    if tuple(image.shape[-2:]) == (size, size):
        return image
    short = view_scale_size(size, crop_pct)
    if min(image.shape[-2:]) != short:
        image = resize(image, [short], interpolation=INTERPOLATIONS[check_interpolation(interpolation)],
                       antialias=True)
    return center_crop(image, [size, size])


def view_boxes(boxes: Tensor, original: tuple[int, int], size: int, crop_pct: float = DEFAULT_CROP_PCT) -> Tensor:
    """Boxes (..., 4) in pixels x0, y0, x1, y1 of an image of ``original`` (height, width) -> the same boxes in
    its ``eval_view``, moved by torchvision's own box transforms (``resize``, ``center_crop``, clamped to the
    view). NaN rows (padding) stay NaN."""
    if tuple(original) == (size, size):
        return boxes.clone()
    shape = boxes.shape
    moved = tv_tensors.BoundingBoxes(boxes.reshape(-1, 4).float(), format="XYXY", canvas_size=tuple(original))
    short = view_scale_size(size, crop_pct)
    if min(original) != short:
        moved = resize(moved, [short], antialias=True)
    moved = clamp_bounding_boxes(center_crop(moved, [size, size]))
    return moved.as_subclass(Tensor).reshape(shape).to(boxes.dtype)
