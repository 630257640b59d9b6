"""Feeding a dataset to a model: the model's input size and normalisation, on its device."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.data import ImageDataset, normalize
from vitscope.data.dataset import raw_batches


def model_input(model: nn.Module, dataset: ImageDataset, img_size: int | None = None
                ) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """(side in pixels, mean, std) for inputs of ``model``: vitscope models use their config size and the
    dataset's statistics; timm models their fixed input size (or ``img_size``, or their pretrained
    config's) and their pretrained normalisation."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "img_size"):
        return cfg.img_size, dataset.mean, dataset.std
    pretrained = getattr(model, "pretrained_cfg", None) or {}
    fixed = getattr(getattr(model, "patch_embed", None), "img_size", None)
    side = (fixed[0] if isinstance(fixed, tuple | list) else fixed) or img_size
    side = side or pretrained.get("input_size", (3, dataset.image_size, dataset.image_size))[-1]
    mean = tuple(pretrained.get("mean", dataset.mean))
    std = tuple(pretrained.get("std", dataset.std))
    return int(side), mean, std


def model_batches(model: nn.Module, dataset: ImageDataset, batch_size: int, device: torch.device | str,
                  img_size: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Normalised images (B, 3, S, S), resized bilinearly to the model's input side S, and labels."""
    side, mean, std = model_input(model, dataset, img_size)
    for images, labels in raw_batches(dataset, batch_size, device):
        images = images.float() / 255.0
        if images.shape[-1] != side or images.shape[-2] != side:
            images = F.interpolate(images, size=(side, side), mode="bilinear", align_corners=False, antialias=True)
        yield normalize(images, mean, std), labels


def has_random_weights(spec: str, weights: str | None = None, pretrained: bool | None = None) -> bool:
    """True when ``spec`` names an architecture built with random weights: a preset, ``timm:NAME`` without a tag
    (or any with ``pretrained=False``), ``hf:ARCH`` or ``open_clip:ARCH`` without a weights file, tag or hub name
    (run folders, ``.safetensors`` files, hub names and cached tags hold trained weights)."""
    from vitscope.models import PRESETS

    spec = str(spec)
    if weights is not None or pretrained:
        return False
    kind, _, name = spec.partition(":")
    if kind == "timm":
        return "." not in name or pretrained is False
    if kind == "hf":
        return "/" not in name and not Path(name).expanduser().is_dir()
    if kind == "open_clip":
        return not any(mark in name for mark in "@/")
    return spec in PRESETS


def model_label(spec: str, weights: str | None = None, pretrained: bool | None = None) -> str:
    """``spec`` as titles and report headers show it: ", random weights" added when it has them."""
    return f"{spec}, random weights" if has_random_weights(spec, weights, pretrained) else str(spec)
