"""The evaluation view of an image: the one place both the in-memory loaders (``sources.py``, ``image_trees.py``)
and the streamed datasets (``stream.py``) turn decoded images (``image_decode.py``) into model-sized pixels.

A ``View`` says how an image becomes a model's input, done with torchvision v2 (antialiased ``resize``, then a
centre cut): by default timm's evaluation transform, the shorter side resized to ``floor(size / crop_pct)`` and the
centre ``size`` x ``size`` cut (never stretched). A model names its own view (``model_view``): timm's
``pretrained_cfg`` (crop_pct, crop_mode, interpolation), or what an adapter wrote there from the model's library
(a transformers image processor, OpenCLIP's preprocess), so the pixels are the ones that library's own transform
gives. A view no model named keeps an image already ``size`` x ``size`` as it is (CIFAR at its native 32 px keeps
its pixels); a model's view follows the model's transform on every image.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2.functional import clamp_bounding_boxes, crop, resize

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


RESIZES = ("shortest", "squash")  # the shorter side to the scale (aspect kept); both sides to it (stretched)
CROP_OFFSETS = ("round", "floor")  # torchvision's CenterCrop (timm, OpenCLIP); transformers' image processors
CROP_MODES = {"center": "shortest", "squash": "squash"}  # timm's ``crop_mode`` -> View.resize


@dataclass(frozen=True)
class View:
    """How an image becomes a model's input: uint8 (..., 3, H, W) -> (..., 3, size, size).

    ``resize="shortest"`` resizes the shorter side to ``scale_size`` (aspect kept: timm's crop_mode ``center``,
    OpenCLIP's ``shortest``, a transformers ``shortest_edge``); ``"squash"`` resizes both sides to it (stretched:
    timm's and OpenCLIP's ``squash``, a transformers ``{height, width}``). Either is antialiased, with
    ``interpolation``. Then the centre ``size`` x ``size`` is cut, its corner at ``round(excess / 2)``
    (``crop_offset="round"``, torchvision's CenterCrop) or ``excess // 2`` (``"floor"``, transformers').
    ``scale_size`` is ``scale`` (pixels) when given, else timm's ``floor(size / crop_pct)``. ``keep_square``: an
    image already ``size`` x ``size`` is kept as it is (a view no model named)."""

    size: int
    crop_pct: float = DEFAULT_CROP_PCT
    interpolation: str = DEFAULT_INTERPOLATION
    resize: str = "shortest"
    scale: int | None = None
    crop_offset: str = "round"
    keep_square: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"view size {self.size!r} must be a positive integer (pixels)")
        check_crop_pct(self.crop_pct)
        check_interpolation(self.interpolation)
        for name, value, known in (("resize", self.resize, RESIZES), ("crop_offset", self.crop_offset, CROP_OFFSETS)):
            if value not in known:
                raise ValueError(f"view {name} {value!r} is unknown; use {' or '.join(known)}")
        if self.scale is not None and self.scale < self.size:
            raise ValueError(f"view scale {self.scale} is below its size {self.size}; the crop would need padding")

    @property
    def scale_size(self) -> int:
        """The side (pixels) the image is resized to before the centre ``size`` x ``size`` is cut."""
        return self.scale if self.scale is not None else view_scale_size(self.size, self.crop_pct)

    def at(self, side: int) -> View:
        """The same view at input side ``side``: an explicit ``scale`` keeps its ratio to the size (whole pixels,
        rounded down), else ``floor(side / crop_pct)`` as timm computes it at any size."""
        if side == self.size:
            return self
        scale = None if self.scale is None else max(side, side * self.scale // self.size)
        return replace(self, size=side, scale=scale)

    def geometry(self, height: int, width: int) -> tuple[tuple[int, int], int, int]:
        """((height, width) after the resize, top, left of the cut) for an image of ``height`` x ``width``."""
        scale = self.scale_size
        if self.resize == "squash":
            resized = (scale, scale)
        elif min(height, width) == scale:
            resized = (height, width)
        elif height <= width:  # torchvision's and transformers' shortest-edge rule: the longer side truncated
            resized = (scale, int(scale * width / height))
        else:
            resized = (int(scale * height / width), scale)
        top, left = (self._offset(side - self.size) for side in resized)
        return resized, top, left

    def _offset(self, excess: int) -> int:
        return int(round(excess / 2.0)) if self.crop_offset == "round" else excess // 2

    def __call__(self, image: Tensor) -> Tensor:
        """uint8 (..., 3, H, W) -> this view (..., 3, size, size)."""
        height, width = (int(v) for v in image.shape[-2:])
        if self.keep_square and (height, width) == (self.size, self.size):
            return image
        resized, top, left = self.geometry(height, width)
        if resized != (height, width):
            image = resize(image, list(resized), interpolation=INTERPOLATIONS[self.interpolation], antialias=True)
        return image[..., top : top + self.size, left : left + self.size]

    def key(self) -> list:
        """What sets these pixels, for cache keys: [size, crop_pct], the interpolation when not bilinear, and the
        rest only where it differs from a view no model named (so older keys of such views stay valid)."""
        out: list = [self.size, self.crop_pct] + ([self.interpolation] if self.interpolation != "bilinear" else [])
        extras = {k: v for k, v in (("resize", self.resize), ("scale", self.scale), ("crop_offset", self.crop_offset),
                                    ("keep_square", self.keep_square)) if v != View.__dataclass_fields__[k].default}
        return out + ([extras] if extras else [])

    def to_dict(self) -> dict[str, Any]:
        """The view as recorded in results: every field and the resized side."""
        return {**asdict(self), "scale_size": self.scale_size}


def eval_view(image: Tensor, size: int | View, crop_pct: float = DEFAULT_CROP_PCT,
              interpolation: str = DEFAULT_INTERPOLATION) -> Tensor:
    """uint8 (..., 3, H, W) -> (..., 3, S, S): ``size`` a ``View``, or the side S of the view no model named (kept
    as it is when already S x S, else the shorter side resized to ``floor(S / crop_pct)`` with ``interpolation``,
    antialiased, and the centre S x S cut)."""
    view = size if isinstance(size, View) else View(int(size), crop_pct, interpolation)
    return view(image)


def view_boxes(boxes: Tensor, original: tuple[int, int], size: int | View,
               crop_pct: float = DEFAULT_CROP_PCT) -> Tensor:
    """Boxes (..., 4) in pixels x0, y0, x1, y1 of an image of ``original`` (height, width) -> the same boxes in
    its ``eval_view`` (``size`` and ``crop_pct`` as there), moved by torchvision's own box transforms (``resize``,
    ``crop``, clamped to the view). NaN rows (padding) stay NaN."""
    view = size if isinstance(size, View) else View(int(size), crop_pct)
    if view.keep_square and tuple(original) == (view.size, view.size):
        return boxes.clone()
    shape = boxes.shape
    moved = tv_tensors.BoundingBoxes(boxes.reshape(-1, 4).float(), format="XYXY", canvas_size=tuple(original))
    resized, top, left = view.geometry(*original)
    if resized != tuple(original):
        moved = resize(moved, list(resized), antialias=True)
    moved = clamp_bounding_boxes(crop(moved, top, left, view.size, view.size))
    return moved.as_subclass(Tensor).reshape(shape).to(boxes.dtype)


def model_side(model: Any, img_size: int | None = None) -> int | None:
    """The input side in pixels ``model`` is built for: a vitscope model's config size, a timm model's fixed
    input size (after ``load(..., img_size=)``, which resamples its position embedding to it), else ``img_size``,
    else its pretrained config's; None for a model that takes any size and names none."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "img_size"):
        return int(cfg.img_size)
    fixed = getattr(getattr(model, "patch_embed", None), "img_size", None)
    side = (fixed[0] if isinstance(fixed, tuple | list) else fixed) or img_size
    side = side or (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (None,))[-1]
    return int(side) if side else None


def model_view(model: Any, dataset: str | None = None, side: int | None = None) -> View:
    """The view ``model`` names for its inputs, at ``side`` (default: ``model_side``), read from its
    ``pretrained_cfg`` (timm's keys, which vitscope's adapters also write for transformers and OpenCLIP models):

    - ``crop_pct``, ``crop_mode`` (``center``: shorter side resized, centre crop; ``squash``: both sides resized,
      centre crop), ``interpolation``, ``input_size``: timm's evaluation transform (``create_transform(
      **resolve_data_config(model=model))``), followed on every image;
    - ``resize_size`` (the side resized to at ``input_size``, where ``floor(size / crop_pct)`` would not say it
      exactly) and ``crop_offset`` (``floor`` for transformers' centre crop): what an adapter adds.

    A model without ``crop_pct`` (vitscope's own) gets the view no model named: the ``dataset``'s crop fraction
    (``default_crop_pct``), its ``interpolation`` or bilinear, an image already S x S kept as it is."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    side = side or model_side(model)
    if not side:
        raise ValueError(f"{type(model).__name__} names no input side; pass img_size (--img-size)")
    named = cfg.get("interpolation")
    interpolation = named if named in INTERPOLATIONS else DEFAULT_INTERPOLATION
    if not cfg.get("crop_pct"):
        return View(int(side), default_crop_pct(dataset or ""), interpolation)
    mode = cfg.get("crop_mode") or "center"
    if mode not in CROP_MODES:
        raise ValueError(f"the model's crop_mode {mode!r} (a padded view) is not reproduced; vitscope views "
                         f"{' and '.join(CROP_MODES)}: set model.pretrained_cfg['crop_mode'] to one of them")
    native = int((cfg.get("input_size") or (None, None, side))[-1])
    view = View(native, check_crop_pct(cfg["crop_pct"]), interpolation, CROP_MODES[mode], cfg.get("resize_size"),
                cfg.get("crop_offset", "round"), keep_square=False)
    return view.at(int(side))


def model_normalization(model: Any, mean: tuple[float, ...], std: tuple[float, ...]
                        ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) ``model``'s inputs are normalised with: the dataset's (``mean``, ``std``) for vitscope's own
    models, a pretrained config's where it names them (timm's, or an adapter's from its library)."""
    if getattr(getattr(model, "cfg", None), "img_size", None) is not None:
        return tuple(mean), tuple(std)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return tuple(cfg.get("mean", mean)), tuple(cfg.get("std", std))
