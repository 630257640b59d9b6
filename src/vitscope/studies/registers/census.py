"""The high-norm token census of one model on one dataset (arXiv 2603.25803, after Darcet et al. 2309.16588).

Per token layer (0 = input of block 1, l = output of block l, before the final norm):

* token-norm distributions of patch, CLS and register tokens (log-binned histograms and summaries);
* the high-norm fraction of patch tokens under each threshold mode, the threshold fixed on the detection
  layer (default: the last) and applied to every layer, so that the first layer with high-norm tokens means
  something; prefix tokens (CLS, registers) are never candidates and never enter a threshold;
* whether each layer's own patch-token norms have a separate high-norm mode (``metrics.high_norm.separate_mode``
  on that layer alone: a ``separate_mode`` row, 1 or 0, with the split, its share and gap, and per image the
  patches in the mode where there is one);
* where they sit, under the first threshold mode: their share on background patches against the share of
  all patches (when the data has masks or boxes), and the mean intensity and local variance of their patches
  against normal patches (``vitscope.metrics.high_norm``);
* what attends to them: the attention mass that CLS and patch queries of attention layer l put on the
  high-norm patches of token layer l - 1 (its keys), against those patches' share of all keys.

Hierarchical models (Swin, PVT-v2) have no prefix tokens and change width per stage: each stage gets its own
threshold, set on the stage's last block and applied to every block of the stage; attention mass is measured
per stage on the model's own geometry, over the keys each query can see (``hier``: Swin windows,
PVT-v2's reduced key grid). Results are flat rows ``{model, layer, layer_kind, group, metric, value, n,
threshold, threshold_value[, stage]}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitscope.analyze.inputs import model_batches, model_input
from vitscope.data import ImageDataset
from vitscope.metrics.high_norm import (
    high_norm_mask,
    mass_on_high_norm,
    mode_units,
    patch_in_boxes,
    patch_object_fraction,
    patch_statistics,
    region_share,
    separate_mode,
)
from vitscope.metrics.norms import Threshold, high_norm_threshold, log_histograms, parse_threshold
from vitscope.metrics.units import per_image_picked
from vitscope.models.capture.sites import token_blocks
from vitscope.models.capture.token_map import token_map
from vitscope.probes.results import row
from vitscope.record import record_attention, record_tokens
from vitscope.studies.registers.hier import hierarchical_attention_rows

HISTOGRAM_BINS = 48  # log-spaced bins of the norm histograms


@dataclass
class CensusSettings:
    """``thresholds``: specs, the first one drives location and attention; ``detect_layer``: token layer
    (0..L) or ``"last"``; ``attention_images``: images whose attention maps are recorded; ``example_images``:
    images kept for artifact maps."""

    thresholds: list[str] = field(default_factory=lambda: ["auto", "percentile:98", "absolute:150"])
    detect_layer: int | str = "last"
    attention_images: int = 32
    example_images: int = 8
    batch_size: int = 64
    img_size: int | None = None

    def __post_init__(self) -> None:
        if not self.thresholds:
            raise ValueError("the census needs at least one threshold, e.g. percentile:98")
        for spec in self.thresholds:
            parse_threshold(spec)
        if self.detect_layer != "last" and (not isinstance(self.detect_layer, int) or self.detect_layer < 0):
            raise ValueError(f"detect_layer={self.detect_layer!r} must be a token layer number >= 0 or 'last'")


@dataclass
class Census:
    """What ``run_census`` measured: ``rows`` (flat), ``histograms`` per layer and group, ``thresholds`` and
    ``tensors`` for figures (images, norm maps, high-norm maps, CLS attention of the last layer)."""

    rows: list[dict[str, Any]]
    histograms: dict[str, Any]
    thresholds: list[dict[str, Any]]
    tokens: dict[str, Any]
    tensors: dict[str, Tensor]
    high_norm: dict[int, Tensor] = field(default_factory=dict)  # token layer -> (images, patches), first threshold


def _row(model: str, layer: int, group: str, metric: str, value: float | Tensor, n: int, layer_kind: str = "token",
         **extra: Any) -> dict[str, Any]:
    """A shared-schema row (``probes.results.row``) with the census's extra fields (threshold, stage, units)."""
    return row(model=model, layer=layer, layer_kind=layer_kind, group=group, metric=metric, value=float(value),
               n=int(n)) | extra


def _mode_row(label: str, layer: int, patches: Tensor, **extra: Any) -> dict[str, Any]:
    """Whether token layer ``layer``'s own patch-token norms (images, patches) have a separate high-norm mode."""
    check = separate_mode(patches)
    gap = check.gap_iqr if math.isfinite(check.gap_iqr) else None
    return _row(label, layer, "patch", "separate_mode", float(check.separate), patches.numel(), threshold="largest-gap",
                threshold_value=check.threshold, mode_fraction=check.fraction, mode_ratio=check.ratio,
                mode_gap_iqr=gap, **extra) | ({"units": mode_units(patches, check)} if check.separate else {})


def _detect_index(settings: CensusSettings, layers: list[int]) -> int:
    if settings.detect_layer == "last":
        return len(layers) - 1
    if settings.detect_layer not in layers:
        raise ValueError(f"detect_layer={settings.detect_layer} is not a recorded token layer; use one of "
                         f"{layers[0]}..{layers[-1]} or 'last'")
    return layers.index(settings.detect_layer)


PatchStats = dict[tuple[int, int], tuple[Tensor, Tensor]]  # grid -> (intensity, variance), each (images, cells)


@torch.no_grad()
def _token_grids(model: nn.Module, dataset: ImageDataset, settings: CensusSettings, device: torch.device
                 ) -> list[tuple[int, int]]:
    """The square token grids of the model's blocks (hierarchical models: one per stage), from one image."""
    images, _ = next(model_batches(model, dataset.subset(1), 1, device, settings.img_size))
    with record_tokens(model, keep="norms") as rec:
        model(images)
    counts = dict.fromkeys(n.shape[1] for n in rec.norms)
    return [(math.isqrt(c), math.isqrt(c)) for c in counts if math.isqrt(c) ** 2 == c]


@torch.no_grad()
def _record(model: nn.Module, dataset: ImageDataset, settings: CensusSettings, device: torch.device,
            plain: bool, grids: list[tuple[int, int]], progress: bool) -> tuple[list[Tensor], PatchStats, Tensor]:
    """Token norms per token layer (images, T); the local statistics of every image's patches on each grid
    (computed batch by batch, so memory holds no images); the first example images in [0, 1] at model side."""
    side, mean, std = model_input(model, dataset, settings.img_size)
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    grids = [g for g in grids if side % g[0] == 0 and side % g[1] == 0]
    embedded: list[Tensor] = []
    handle = None
    if plain:  # token layer 0: the input of block 1
        handle = model.blocks[0].register_forward_pre_hook(
            lambda _m, args: embedded.append(args[0].detach().float().norm(dim=-1).cpu()))
    stats: dict[tuple[int, int], list[tuple[Tensor, Tensor]]] = {g: [] for g in grids}
    examples, kept = [], 0
    bar = tqdm(total=len(dataset), unit="img", desc="census", disable=not progress, dynamic_ncols=True)
    try:
        with record_tokens(model, keep="norms") as rec:
            for images, _ in model_batches(model, dataset, settings.batch_size, device, settings.img_size):
                model(images)
                pixels = (images.cpu() * s + m).clamp(0, 1)
                for grid in grids:
                    stats[grid].append(patch_statistics(pixels, grid))
                if kept < settings.example_images:
                    examples.append(pixels[: settings.example_images - kept])
                    kept += len(examples[-1])
                bar.update(len(images))
    finally:
        bar.close()
        if handle is not None:
            handle.remove()
    norms = [n.cpu() for n in rec.norms]
    patch_stats = {g: (torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts]))
                   for g, parts in stats.items()}
    return ([torch.cat(embedded)] if plain else []) + norms, patch_stats, torch.cat(examples)


def _object_map(dataset: ImageDataset, grid: tuple[int, int], side: int) -> Tensor | None:
    """(images, N) boolean object map of the patches, from masks (majority) or boxes (centre); None without."""
    masks, boxes = dataset.extras.get("masks"), dataset.extras.get("boxes")
    if masks is not None:
        if side % grid[0] or side % grid[1]:
            return None
        parts = []
        for start in range(0, len(masks), 256):  # chunks: masks at model side never all in memory
            chunk = masks[start : start + 256, None].float()
            parts.append(patch_object_fraction(F.interpolate(chunk, size=(side, side), mode="nearest")[:, 0], grid))
        return torch.cat(parts) >= 0.5
    if boxes is not None:
        scale = side / dataset.image_size
        return patch_in_boxes(boxes.float() * scale, grid, (side, side))
    return None


def _location_rows(label: str, layer: int, high: Tensor, local: tuple[Tensor, Tensor] | None,
                   objects: Tensor | None, extra: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    if local is not None:
        intensity, variance = local
        for group, pick in (("high-norm", high), ("normal", ~high)):
            count = int(pick.sum())
            if count:
                for metric, values in (("patch_intensity", intensity), ("patch_local_variance", variance)):
                    rows.append(_row(label, layer, group, metric, values[pick].mean(), count, **extra)
                                | {"units": per_image_picked(values, pick)})
    if objects is not None:
        share = region_share(high, objects)
        if share["count_high"]:
            rows.append(_row(label, layer, "high-norm", "background_share", share["background_share_high"],
                             share["count_high"], **extra))
        rows.append(_row(label, layer, "patch", "background_share", share["background_share_all"], high.numel(),
                         **extra))
    return rows


def _attention_images(model: nn.Module, dataset: ImageDataset, settings: CensusSettings, device: torch.device
                      ) -> Tensor:
    """The first ``attention_images`` images in dataset order (those whose norms are ``norms[:, :count]``)."""
    count = min(settings.attention_images, len(dataset))
    batches = []
    for batch, _ in model_batches(model, dataset, min(settings.batch_size, count), device, settings.img_size):
        batches.append(batch)
        if sum(len(b) for b in batches) >= count:
            break
    return torch.cat(batches)[:count]


@torch.no_grad()
def _attention_rows(model: nn.Module, dataset: ImageDataset, settings: CensusSettings, device: torch.device,
                    label: str, norms: list[Tensor], threshold: Threshold, prefix: int, extra: dict[str, Any]
                    ) -> tuple[list[dict[str, Any]], Tensor]:
    """Attention mass on high-norm keys per attention layer, and the CLS rows (images, T) of the last layer."""
    images = _attention_images(model, dataset, settings, device)
    count = len(images)
    with record_attention(model, keep="maps") as rec:
        model(images)
    rows = []
    for index, probs in enumerate(rec.maps):
        probs = probs.float().cpu()
        keys = high_norm_mask(norms[index][:count], threshold.value, prefix)  # token layer index = block index
        mass = mass_on_high_norm(probs, keys, prefix)
        layer = index + 1  # attention layer l reads token layer l - 1
        for group in ("cls", "patch"):
            if prefix or group == "patch":
                rows.append(_row(label, layer, f"{group}-query", "attention_mass_on_high_norm",
                                 mass[group].mean(), count, layer_kind="attention", **extra))
        rows.append(_row(label, layer, "high-norm", "key_share", mass["share"].mean(), count,
                         layer_kind="attention", **extra))
    last = rec.maps[-1].float().cpu().mean(dim=1)  # (images, T, T) averaged over heads
    return rows, last[:, 0] if prefix else last.mean(dim=1)


@dataclass
class _Recorded:
    """What the census recorded of one model, handed from ``run_census`` to the plain or hierarchical census:
    ``norms`` per token layer (images, tokens), ``local`` patch statistics per grid, ``examples`` (images, 3,
    side, side) kept for the maps, ``side`` the model's input side in pixels."""

    model: nn.Module
    dataset: ImageDataset
    settings: CensusSettings
    device: torch.device
    label: str
    tokens: dict[str, Any]
    norms: list[Tensor]
    local: PatchStats
    examples: Tensor
    side: int


def run_census(model: nn.Module, dataset: ImageDataset, label: str, settings: CensusSettings | None = None,
               device: torch.device | str = "cpu", progress: bool = True) -> Census:
    """Measure ``model`` (plain ViT, Swin or PVT-v2) on ``dataset``; see the module docstring."""
    settings = settings or CensusSettings()
    device = torch.device(device)
    model = model.to(device).eval()
    tokens = token_map(model)
    plain = tokens["kind"] == "plain"
    grids = [tuple(tokens["patches"]["grid"])] if plain else _token_grids(model, dataset, settings, device)
    norms, local, examples = _record(model, dataset, settings, device, plain, grids, progress)
    recorded = _Recorded(model, dataset, settings, device, label, tokens, norms, local, examples, examples.shape[-1])
    return _plain_census(recorded) if plain else _hierarchical_census(recorded)


def _plain_census(r: _Recorded) -> Census:
    model, dataset, settings, device, label = r.model, r.dataset, r.settings, r.device, r.label
    tokens, norms, local, examples, side = r.tokens, r.norms, r.local, r.examples, r.side
    prefix, grid = tokens["num_prefix_tokens"], tuple(tokens["patches"]["grid"])
    layers = list(range(len(norms)))  # token layers 0..L
    detect = _detect_index(settings, layers)
    thresholds = [high_norm_threshold(norms[detect][:, prefix:], spec) for spec in settings.thresholds]
    objects = _object_map(dataset, grid, side)
    rows = []
    groups = {"patch": tokens["patches"]["start"], "cls": tokens["cls"], "register": tokens["registers"]}
    for layer, n in zip(layers, norms, strict=True):
        for group, index in groups.items():
            values = n[:, index:] if group == "patch" else n[:, index]
            if values.numel():
                rows.append(_row(label, layer, group, "norm_mean", values.mean(), values.numel()))
                rows.append(_row(label, layer, group, "norm_median", values.median(), values.numel()))
        rows.append(_mode_row(label, layer, n[:, prefix:]))
        for t in thresholds:
            high = high_norm_mask(n, t.value, prefix)
            rows.append(_row(label, layer, "patch", "high_norm_fraction", high.float().mean(), high.numel(),
                             threshold=t.spec, threshold_value=t.value))
        primary = thresholds[0]
        extra = {"threshold": primary.spec, "threshold_value": primary.value}
        rows += _location_rows(label, layer, high_norm_mask(n, primary.value, prefix), local.get(grid), objects,
                               extra)
    attention, cls_rows = _attention_rows(model, dataset, settings, device, label, norms, thresholds[0], prefix,
                                          {"threshold": thresholds[0].spec, "threshold_value": thresholds[0].value})
    hist_groups = {"patch": [n[:, prefix:] for n in norms], "cls": [n[:, tokens["cls"]] for n in norms],
                   "register": [n[:, tokens["registers"]] for n in norms]}
    shown = len(examples)
    tensors = {
        "images": examples.contiguous(),
        "norm_maps": norms[detect][:shown, prefix:].reshape(shown, *grid).contiguous(),
        "high_norm_maps": high_norm_mask(norms[detect][:shown], thresholds[0].value, prefix)
        .reshape(shown, *grid).to(torch.uint8).contiguous(),
        "cls_attention_last": cls_rows[:shown].contiguous(),
    }
    return Census(rows + attention, log_histograms(hist_groups, layers, HISTOGRAM_BINS),
                  [{"spec": t.spec, "value": t.value, "detection_layer": layers[detect]} for t in thresholds],
                  tokens, tensors, {layer: high_norm_mask(n, thresholds[0].value, prefix)
                                    for layer, n in zip(layers, norms, strict=True)})


def _hierarchical_census(r: _Recorded) -> Census:
    model, dataset, settings, device, label = r.model, r.dataset, r.settings, r.device, r.label
    tokens, norms, local, examples, side = r.tokens, r.norms, r.local, r.examples, r.side
    names = [name for name, _ in token_blocks(model)]
    stages = [int(name.split(".")[1]) for name in names]
    rows, thresholds, primary_of, high_norm = [], [], {}, {}
    for stage in sorted(set(stages)):
        members = [i for i, s in enumerate(stages) if s == stage]
        detect = members[-1]
        count = norms[detect].shape[1]
        side_cells = math.isqrt(count)
        grid = (side_cells, side_cells) if side_cells * side_cells == count else None
        objects = _object_map(dataset, grid, side) if grid else None
        stage_thresholds = [high_norm_threshold(norms[detect], spec) for spec in settings.thresholds]
        thresholds += [{"spec": t.spec, "value": t.value, "detection_layer": detect + 1, "stage": stage + 1}
                       for t in stage_thresholds]
        primary_of[stage] = stage_thresholds[0]
        for i in members:
            n, extra = norms[i], {"stage": stage + 1}
            high_norm[i + 1] = n > stage_thresholds[0].value
            rows.append(_row(label, i + 1, "patch", "norm_mean", n.mean(), n.numel(), **extra))
            rows.append(_row(label, i + 1, "patch", "norm_median", n.median(), n.numel(), **extra))
            rows.append(_mode_row(label, i + 1, n, **extra))
            for t in stage_thresholds:
                high = n > t.value
                rows.append(_row(label, i + 1, "patch", "high_norm_fraction", high.float().mean(), high.numel(),
                                 threshold=t.spec, threshold_value=t.value, **extra))
            if grid:
                primary = stage_thresholds[0]
                rows += _location_rows(label, i + 1, n > primary.value, local.get(grid), objects,
                                       {"threshold": primary.spec, "threshold_value": primary.value, **extra})
    images = _attention_images(model, dataset, settings, device)
    rows += hierarchical_attention_rows(model, images, stages, primary_of, label)
    layers = list(range(1, len(norms) + 1))
    histograms = log_histograms({"patch": norms}, layers, HISTOGRAM_BINS)
    return Census(rows, histograms, thresholds, tokens, {"images": examples.contiguous()}, high_norm)
