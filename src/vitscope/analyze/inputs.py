"""Feeding a dataset to a model: the model's input size and normalisation, on its device."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset, normalize
from vitscope.data.dataset import raw_batches
from vitscope.data.pixels import View, model_normalization, model_side, model_view
from vitscope.models import has_random_weights

__all__ = ["dataset_view", "model_batches", "model_crop_pct", "model_input", "model_interpolation", "model_label",
           "model_side", "model_view", "model_view_options"]


def model_crop_pct(model: nn.Module, dataset_name: str | None = None) -> float:
    """The crop fraction of ``model``'s evaluation view (``vitscope.data.pixels.model_view``)."""
    return model_view(model, dataset_name, model_side(model) or 1).crop_pct


def model_interpolation(model: nn.Module) -> str:
    """How ``model``'s evaluation view resamples (``vitscope.data.pixels.model_view``): its pretrained config's
    ``interpolation`` (as timm's eval transform; bicubic for most pretrained ViTs) where the views support it, else
    bilinear."""
    return model_view(model, None, model_side(model) or 1).interpolation


def model_view_options(model: nn.Module, dataset_name: str, img_size: int | None = None) -> dict[str, object]:
    """``load_dataset`` options that view a folder of mixed-size images as ``model`` sees them (``mixed_size``: its
    ``model_view`` at its input side; images of one size keep their pixels and ``model_batches`` views them)."""
    side = model_side(model, img_size)
    return {"mixed_size": model_view(model, dataset_name, side) if side else None}


def model_input(model: nn.Module, dataset: ImageDataset, img_size: int | None = None
                ) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """(side in pixels, mean, std) for inputs of ``model``: its ``model_side`` (else the dataset's image size),
    the dataset's statistics for vitscope models, timm models' pretrained normalisation."""
    side = model_side(model, img_size) or dataset.image_size
    return side, *model_normalization(model, dataset.mean, dataset.std)


def dataset_view(model: nn.Module, dataset: ImageDataset, img_size: int | None = None) -> View:
    """The view ``model`` takes of ``dataset``'s images: its ``model_view`` at its input side (the dataset's image
    size for a model that names none), the crop fraction of the dataset's layout where the model names none."""
    side, _, _ = model_input(model, dataset, img_size)
    return model_view(model, getattr(dataset, "name", None), side)


def model_batches(model: nn.Module, dataset: ImageDataset, batch_size: int, device: torch.device | str,
                  img_size: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Normalised images (B, 3, S, S) and labels: each image's view as ``model`` takes it (``dataset_view``: the
    model's own transform; an image already S x S kept only by a model that names none), computed on the CPU as
    the dataset loaders compute it, then moved to ``device``. Images the loader already viewed so
    (``dataset.view``, e.g. ``load_dataset(..., view=model)``) are used as they are."""
    _, mean, std = model_input(model, dataset, img_size)
    view = dataset_view(model, dataset, img_size)
    viewed = getattr(dataset, "view", None) == view
    for images, labels in raw_batches(dataset, batch_size, "cpu"):  # viewed on the CPU: the loaders' pixels
        images = images if viewed else view(images)
        yield normalize(images.to(device), mean, std), labels.to(device)


def model_label(spec: str, weights: str | None = None, pretrained: bool | None = None) -> str:
    """``spec`` as titles and report headers show it: ", random weights" added when it has them."""
    return f"{spec}, random weights" if has_random_weights(spec, weights, pretrained) else str(spec)
