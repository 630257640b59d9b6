"""The figures of ``vitscope analyze``: from an analysis result to PNG files, preprocessing included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from vitscope.analyze import LocalityResult
from vitscope.analyze.inputs import model_batches
from vitscope.analyze.norms import NormsResult
from vitscope.data import ImageDataset
from vitscope.models import token_layout
from vitscope.report.figures.locality import behaviour_space, per_layer, uniform_mad
from vitscope.report.figures.norms import high_norm_maps, norm_histograms

MAX_MAP_IMAGES = 16


def locality_figures(result: LocalityResult, model: nn.Module, label: str, out: Path, unit: str
                     ) -> dict[str, Path]:
    """The behaviour space (MAD against entropy per head) and MAD per layer, with the uniform-attention MAD
    drawn as a reference for plain ViTs."""
    mad, entropy = result.stats.mad.numpy(), result.stats.entropy.numpy()
    uniform = plain_uniform_mad(model, unit)
    return {"figure": behaviour_space({label: (mad, entropy)}, out / "behaviour_space.png", unit=unit,
                                      uniform=uniform),
            "per-layer": per_layer({label: mad}, f"MAD ({unit})", out / "mad_per_layer.png", reference=uniform)}


def plain_uniform_mad(model: nn.Module, unit: str) -> float | None:
    """The uniform-attention MAD of a plain ViT's grid in ``unit``; None for hierarchical models (one grid per
    stage), whose figures then show the entropy reference only."""
    try:
        layout = token_layout(model)
    except (ValueError, AttributeError):
        return None
    return uniform_mad(layout.grid_size, unit, layout.patch_size)


def norm_figures(result: NormsResult, model: nn.Module, dataset: ImageDataset, out: Path,
                 img_size: int | None = None, label: str | None = None) -> dict[str, Path]:
    """Norm histograms per token layer (patch, CLS and register tokens in their own colours); for plain ViTs
    also the high-norm maps of the first images beside those images (each image min-max scaled to [0, 1] for
    display). ``label`` names the model in titles."""
    layers = [f"layer {i + 1}" for i in range(len(result.norms))]  # token layer l = output of block l
    if result.tokens["kind"] == "plain":  # patches are the threshold's candidates; CLS and registers drawn apart
        patches = [n[:, result.prefix:].numpy().ravel() for n in result.norms]
        prefix = {group: [n[:, result.tokens.get(key, [])].numpy().ravel() for n in result.norms]
                  for group, key in (("cls", "cls"), ("register", "registers")) if result.tokens.get(key)}
    else:
        patches, prefix = [n.numpy().ravel() for n in result.norms], {}
    files = {"histograms": norm_histograms(patches, layers, result.threshold.value, result.threshold.spec,
                                           out / "norm_histograms.png", model=label, prefix=prefix,
                                           threshold_layer=layers[result.detect_layer])}
    if result.tokens["kind"] == "plain":
        shown, maps = norm_map_inputs(result, model, dataset, img_size)
        files["maps"] = high_norm_maps(shown, maps, result.threshold.value, out / "high_norm_maps.png",
                                       layer=result.detect_layer + 1, model=label)
    return files


def norm_map_inputs(result: NormsResult, model: nn.Module, dataset: ImageDataset, img_size: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The first ``MAX_MAP_IMAGES`` images of ``dataset`` (N, H, W, 3) in [0, 1] and, for the same images (the
    norms are in dataset order), their detection-layer patch-norm maps (N, gh, gw)."""
    grid = result.tokens["patches"]["grid"]
    count = min(MAX_MAP_IMAGES, len(dataset), len(result.norms[result.detect_layer]))
    images, _ = next(model_batches(model, dataset, count, "cpu", img_size))  # the first batch: images 0..count-1
    shown = images - images.amin(dim=(1, 2, 3), keepdim=True)
    shown = (shown / shown.amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-12)).permute(0, 2, 3, 1).numpy()
    maps = result.norms[result.detect_layer][:count, result.prefix:].reshape(count, *grid).numpy()
    return shown, maps
