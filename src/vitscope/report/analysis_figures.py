"""The figures of ``vitscope analyze``: from an analysis result to PNG files, preprocessing included."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from vitscope.analyze import LocalityResult
from vitscope.analyze.inputs import model_batches
from vitscope.analyze.norms import NormsResult
from vitscope.data import ImageDataset
from vitscope.report.figures import behaviour_space, per_layer
from vitscope.report.norm_figures import high_norm_maps, norm_histograms

MAX_MAP_IMAGES = 16


def locality_figures(result: LocalityResult, label: str, out: Path, unit: str) -> dict[str, Path]:
    """The behaviour space (MAD against entropy per head) and MAD per layer."""
    mad, entropy = result.stats.mad.numpy(), result.stats.entropy.numpy()
    return {"figure": behaviour_space({label: (mad, entropy)}, out / "behaviour_space.png", unit=unit),
            "per-layer": per_layer({label: mad}, f"MAD ({unit})", out / "mad_per_layer.png")}


def norm_figures(result: NormsResult, model: nn.Module, dataset: ImageDataset, out: Path,
                 img_size: int | None = None) -> dict[str, Path]:
    """Norm histograms per layer; for plain ViTs also the high-norm maps of the first images over the images
    (each image min-max scaled to [0, 1] for display)."""
    files = {"histograms": norm_histograms([n.numpy().ravel() for n in result.norms], result.names,
                                           result.threshold.value, result.threshold.spec,
                                           out / "norm_histograms.png")}
    if result.tokens["kind"] == "plain":
        grid = result.tokens["patches"]["grid"]
        count = min(MAX_MAP_IMAGES, len(dataset))
        images, _ = next(model_batches(model, dataset.subset(count), count, "cpu", img_size))
        shown = images - images.amin(dim=(1, 2, 3), keepdim=True)
        shown = (shown / shown.amax(dim=(1, 2, 3), keepdim=True)).permute(0, 2, 3, 1).numpy()
        maps = result.norms[result.detect_layer][:count, result.prefix:].view(count, *grid).numpy()
        files["maps"] = high_norm_maps(shown, maps, result.threshold.value, out / "high_norm_maps.png")
    return files
