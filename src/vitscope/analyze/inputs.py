"""Feeding a dataset to a model: the model's input size and normalisation, on its device."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset, normalize
from vitscope.data.dataset import raw_batches
from vitscope.data.pixels import DEFAULT_INTERPOLATION, INTERPOLATIONS, check_crop_pct, default_crop_pct, eval_view
from vitscope.models import has_random_weights


def model_side(model: nn.Module, img_size: int | None = None) -> int | None:
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


def model_crop_pct(model: nn.Module, dataset_name: str | None = None) -> float:
    """The crop fraction of ``model``'s evaluation view: its pretrained config's ``crop_pct`` (as timm's eval
    transform), else the dataset's default (``vitscope.data.pixels.default_crop_pct``)."""
    crop = (getattr(model, "pretrained_cfg", None) or {}).get("crop_pct")
    return check_crop_pct(crop) if crop else default_crop_pct(dataset_name or "")


def model_interpolation(model: nn.Module) -> str:
    """How ``model``'s evaluation view resamples: its pretrained config's ``interpolation`` (as timm's eval
    transform; bicubic for most pretrained ViTs) where the views support it, else bilinear."""
    named = (getattr(model, "pretrained_cfg", None) or {}).get("interpolation")
    return named if named in INTERPOLATIONS else DEFAULT_INTERPOLATION


def model_view_options(model: nn.Module, dataset_name: str, img_size: int | None = None) -> dict[str, object]:
    """``load_dataset`` options that view a folder of mixed-size images as ``model`` sees them: at its input side,
    with its crop fraction and interpolation (images of one size keep their pixels; ``model_batches`` views them)."""
    return {"mixed_size": model_side(model, img_size), "crop_pct": model_crop_pct(model, dataset_name),
            "interpolation": model_interpolation(model)}


def model_input(model: nn.Module, dataset: ImageDataset, img_size: int | None = None
                ) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """(side in pixels, mean, std) for inputs of ``model``: its ``model_side`` (else the dataset's image size),
    the dataset's statistics for vitscope models, timm models' pretrained normalisation."""
    side = model_side(model, img_size) or dataset.image_size
    if getattr(getattr(model, "cfg", None), "img_size", None) is not None:
        return side, dataset.mean, dataset.std
    pretrained = getattr(model, "pretrained_cfg", None) or {}
    return side, tuple(pretrained.get("mean", dataset.mean)), tuple(pretrained.get("std", dataset.std))


def model_batches(model: nn.Module, dataset: ImageDataset, batch_size: int, device: torch.device | str,
                  img_size: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Normalised images (B, 3, S, S) and labels: each image's evaluation view at the model's input side S
    (``eval_view``: kept when already S x S, else shorter side resized with the model's interpolation and a centre
    crop, never stretched), computed on the CPU as the dataset loaders compute it, then moved to ``device``."""
    side, mean, std = model_input(model, dataset, img_size)
    crop, resampling = model_crop_pct(model, getattr(dataset, "name", None)), model_interpolation(model)
    for images, labels in raw_batches(dataset, batch_size, "cpu"):  # viewed on the CPU: the loaders' pixels
        yield normalize(eval_view(images, side, crop, resampling).to(device), mean, std), labels.to(device)


def model_label(spec: str, weights: str | None = None, pretrained: bool | None = None) -> str:
    """``spec`` as titles and report headers show it: ", random weights" added when it has them."""
    return f"{spec}, random weights" if has_random_weights(spec, weights, pretrained) else str(spec)
