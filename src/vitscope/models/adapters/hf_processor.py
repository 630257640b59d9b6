"""The evaluation view of a Hugging Face folder's image processor, in the ``pretrained_cfg`` keys vitscope's views
read (``vitscope.data.pixels.model_view``), so an ``hf:`` model is fed what transformers' ``AutoImageProcessor``
makes of an image: a resize of the shortest edge (``{shortest_edge}``: aspect kept) or of both sides
(``{height, width}``: stretched) with its ``resample``, then its centre crop (corner at ``excess // 2``, where
torchvision's CenterCrop rounds). What has no square view (a patch budget, a longest edge, padding, another
resampling) is named for the load line, and the model gets the view of a model that names none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # the image processors' ``resample`` codes (PIL's) vitscope's views take


@dataclass(frozen=True)
class ProcessorView:
    """What a folder's image processor does to an image, in the ``pretrained_cfg`` keys vitscope's views read
    (``vitscope.data.pixels.model_view``): ``cfg`` (mean, std, interpolation, and for a square view crop_pct,
    crop_mode, resize_size, crop_offset), the side it gives (None: no square view), and what could not be
    reproduced (empty when all of it was)."""

    cfg: dict[str, Any]
    side: int | None = None
    unreproduced: str = ""

    def at(self, side: int) -> dict[str, Any]:
        """``cfg`` for a model fed at ``side``: the resize keeps its ratio to the processor's crop."""
        if self.side is None or side == self.side:
            return dict(self.cfg)
        return {**self.cfg, "resize_size": max(side, side * self.cfg["resize_size"] // self.side)}

    def describe(self) -> str:
        """The load line's words for the view."""
        cfg = self.cfg
        if self.side is None:
            return f"its image processor's view is not reproduced ({self.unreproduced}); images are viewed as by a " \
                   "model that names no view (shorter side resized, centre crop)"
        how = "shortest edge" if cfg["crop_mode"] == "center" else "both sides"
        crop = f", centre {self.side} x {self.side} cut" if cfg["resize_size"] != self.side else ""
        return f"view as its image processor: {how} to {cfg['resize_size']}, {cfg['interpolation']}{crop}"


def _field(size: Any, key: str) -> Any:
    """``key`` of a processor's size (a transformers ``SizeDict`` or a plain dict), None when absent."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def processor_view(transformers: Any, folder: Path) -> ProcessorView:
    """The view of the folder's image processor, as transformers' ``AutoImageProcessor`` builds it from
    ``preprocessor_config.json`` (the class's defaults for what the file leaves out): a resize of the shortest edge
    (``{shortest_edge}``: aspect kept) or of both sides (``{height, width}``: stretched), with ``resample``, then
    its centre crop (corner at ``excess // 2``). Without the file, no view (an empty ``cfg``)."""
    if not (folder / "preprocessor_config.json").is_file():
        return ProcessorView({})
    logs = transformers.utils.logging
    verbosity = logs.get_verbosity()
    logs.set_verbosity_error()
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - a processor transformers cannot build: say so, keep the model
        return ProcessorView({}, None, f"transformers cannot read it: {str(err).strip().splitlines()[0][:120]}")
    finally:
        logs.set_verbosity(verbosity)
    cfg: dict[str, Any] = {k: tuple(float(v) for v in getattr(processor, f"image_{k}"))
                           for k in ("mean", "std") if getattr(processor, f"image_{k}", None) is not None}
    resample = getattr(processor, "resample", None)
    resample = int(resample) if resample is not None else None
    size, crop = getattr(processor, "size", None), getattr(processor, "crop_size", None)
    shortest, height, width = (_field(size, k) for k in ("shortest_edge", "height", "width"))
    crops = getattr(processor, "do_center_crop", False) and crop is not None
    side = _field(crop, "height") if crops else None
    patches = getattr(processor, "max_num_patches", None)
    why = ("it does not resize" if not getattr(processor, "do_resize", False)
           else f"each image resized to at most {patches} patches, its aspect kept" if patches
           else f"resample {resample} (vitscope views bilinear or bicubic)" if resample not in _PIL_RESAMPLE
           else f"size {dict(size) if isinstance(size, dict) else size}" if _field(size, "longest_edge") or not (
               shortest or (height and height == width))
           else f"crop {crop}" if crops and (_field(crop, "width") != side or side > (shortest or height))
           else "no crop after a shortest-edge resize (images of other shapes)" if shortest and not crops else "")
    if why:
        return ProcessorView(cfg, None, why)
    scale = int(shortest or height)
    side = int(side or scale)
    cfg.update(interpolation=_PIL_RESAMPLE[resample], crop_pct=side / scale, resize_size=scale, crop_offset="floor",
               crop_mode="center" if shortest else "squash")
    return ProcessorView(cfg, side)
