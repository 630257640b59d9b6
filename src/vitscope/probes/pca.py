"""PCA maps: the first three principal components of patch features shown as RGB on the patch grid.

Components are fitted jointly over a set of images (``joint=True``: the same colours mean the same directions in
every image) or per image. With ``foreground`` set, patches whose first-component value (min-max scaled to [0, 1]
over the fitted set, sign fixed as below) is at most the threshold are background: shown black, and the three
components are refitted on the foreground patches only (as in DINOv2's figures). Each component's sign is fixed
so that its largest-magnitude loading is positive; each RGB channel is min-max scaled to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.analyze.inputs import model_batches
from vitscope.data import ImageDataset
from vitscope.probes.features import depth_of, extract_features, parse_layers


def principal_components(x: Tensor, k: int = 3) -> tuple[Tensor, Tensor, Tensor]:
    """(components (k, D), explained-variance ratios (k,), mean (D,)) of rows ``x`` (M, D), in float64."""
    x = x.double()
    mean = x.mean(0)
    centred = x - mean
    values, vectors = torch.linalg.eigh(centred.T @ centred / max(len(x) - 1, 1))
    order = values.argsort(descending=True)[:k]
    components = vectors[:, order].T
    signs = components.gather(1, components.abs().argmax(1, keepdim=True)).sign()
    total = values.clamp(min=0).sum()
    return components * signs, values[order].clamp(min=0) / total.clamp(min=1e-30), mean


def _unit_scale(values: Tensor) -> Tensor:
    low, high = values.amin(0), values.amax(0)
    return (values - low) / (high - low).clamp(min=1e-12)


def rgb_maps(patches: Tensor, grid: tuple[int, int], foreground: float | None = None) -> tuple[Tensor, Tensor]:
    """Patches (N, P, D) -> RGB maps (N, rows, cols, 3) in [0, 1] from one PCA over every patch, and the
    explained-variance ratios of the three components."""
    n, p, d = patches.shape
    rows = patches.reshape(n * p, d)
    components, explained, mean = principal_components(rows)
    projected = (rows.double() - mean) @ components.T
    keep = torch.ones(n * p, dtype=torch.bool)
    if foreground is not None:
        keep = _unit_scale(projected[:, :1])[:, 0] > foreground
        if keep.sum() >= 4:
            components, explained, mean = principal_components(rows[keep])
            projected = (rows.double() - mean) @ components.T
    colours = torch.zeros(n * p, 3, dtype=torch.float64)
    if keep.any():
        colours[keep] = _unit_scale(projected[keep])
    return colours.float().reshape(n, *grid, 3), explained.float()


@dataclass
class PcaMaps:
    """``maps`` (N, rows, cols, 3) and ``images`` (N, H, W, 3) in [0, 1]; ``explained`` (N or 1, 3) ratios."""

    maps: Tensor
    images: Tensor
    explained: Tensor
    settings: dict[str, Any] = field(default_factory=dict)


def pca_maps(model: nn.Module, dataset: ImageDataset, layer: str | int = "last", *, joint: bool = True,
             foreground: float | None = None, count: int = 8, norm: bool = True, batch_size: int = 64,
             device: torch.device | str = "cpu", img_size: int | None = None, cache: Any = False,
             progress: bool = True) -> PcaMaps:
    """PCA maps of the patch features of the first ``count`` images at one token ``layer``."""
    layers = parse_layers(layer, depth_of(model))
    if len(layers) != 1:
        raise ValueError(f"PCA maps are drawn for one layer at a time, got {layer!r}")
    subset = dataset if count >= len(dataset) else dataset.__class__(
        dataset.name, dataset.split, dataset.images[:count], dataset.labels[:count], dataset.classes, dataset.mean,
        dataset.std, dataset.root)
    features = extract_features(model, subset, layers, norm=norm, batch_size=batch_size, device=device,
                                img_size=img_size, cache=cache, progress=progress)[layers[0]]
    patches = features.patches.float()
    if joint:
        maps, explained = rgb_maps(patches, features.grid, foreground)
        explained = explained[None]
    else:
        parts = [rgb_maps(patches[i : i + 1], features.grid, foreground) for i in range(len(patches))]
        maps, explained = torch.cat([m for m, _ in parts]), torch.stack([e for _, e in parts])
    shown = torch.cat([images for images, _ in model_batches(model, subset, batch_size, "cpu", img_size)])
    low = shown.amin(dim=(1, 2, 3), keepdim=True)
    shown = ((shown - low) / (shown.amax(dim=(1, 2, 3), keepdim=True) - low).clamp(min=1e-12)).permute(0, 2, 3, 1)
    return PcaMaps(maps, shown, explained, {"layer": layers[0], "joint": joint, "foreground": foreground,
                                            "images": len(subset), "norm": norm})
