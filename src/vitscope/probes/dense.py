"""Dense probes on frozen patch tokens: segmentation (mIoU) and depth (RMSE), layer by layer, with or without CLS.

Head: batch norm + 1x1 linear layer on the patch-token map (B, D, rows, cols), optionally with the CLS token
concatenated to every patch (D -> 2D), its output upsampled bilinearly to each label's own size (labels are only
ever resized nearest-neighbour, with their training crop). Segmentation: cross-entropy with the dataset's ignore
index; scores from one confusion matrix over the eval split (``vitscope.metrics.dense``). Depth (DINOv2's linear
head): 256 bins spaced linearly in [``min_depth``, ``max_depth``] metres, depth = the bin centres weighted by
DINOv2's ``linear`` normalisation (ReLU + 0.1, divided by the sum; ``vitscope.probes.bin_norm``), scale-invariant
log loss (λ = 0.85) on valid pixels; RMSE, abs-rel and δ < 1.25 per image then averaged, and pooled RMSE, over
ground truth in (1e-3, ``max_depth``], in NYU's Eigen crop by default (``vitscope.metrics.dense``).

By default the backbone sees each image resized whole to its (square) input side; with ``size`` images are
resized to that short side, training uses random crops and evaluation a sliding window (``dense_windows``).
Floors: the same probe on a randomly initialised backbone, and the trivial predictor (the most frequent training
class everywhere; the mean training depth everywhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.analyze.inputs import model_input
from vitscope.data.dense import DenseDataset
from vitscope.metrics.dense import confusion_matrix, depth_scores, segmentation_scores
from vitscope.probes.baselines import random_twin
from vitscope.probes.bin_norm import DEFAULT_BIN_NORM, depth_from_bins
from vitscope.probes.dense_windows import eval_windows, stitch, train_crops
from vitscope.probes.features import LayerFeatures, depth_of, extract_features, parse_layers
from vitscope.probes.linear import threads_for
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row

DEPTH_BINS = 256
SILOG_LAMBDA = 0.85
# placements (image, y, x) of each window, resized (height, width) of each image, window side in pixels
Windows = tuple[list[tuple[int, int, int]], list[tuple[int, int]], int]


def patch_maps(features: LayerFeatures, with_cls: bool) -> Tensor:
    """(N, D, rows, cols) float32 patch-token maps; with the CLS token concatenated, (N, 2D, rows, cols)."""
    patches = features.patches.float()
    if with_cls:
        if not features.has_cls:
            raise ValueError("this model has no CLS token to concatenate; probe without CLS")
        patches = torch.cat([patches, features.cls.float()[:, None].expand_as(patches)], dim=-1)
    n, _, d = patches.shape
    return patches.transpose(1, 2).reshape(n, d, *features.grid)


class DenseHead(nn.Module):
    """Batch norm and a 1x1 convolution on (B, D, rows, cols); ``forward(maps, size)`` upsamples to ``size``."""

    def __init__(self, dim: int, outputs: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(dim)
        self.linear = nn.Conv2d(dim, outputs, kernel_size=1)

    def forward(self, maps: Tensor, size: tuple[int, int]) -> Tensor:
        return F.interpolate(self.linear(self.norm(maps)), size=size, mode="bilinear", align_corners=False)


def depth_bins(min_depth: float, max_depth: float, device: torch.device | str = "cpu") -> Tensor:
    return torch.linspace(min_depth, max_depth, DEPTH_BINS, device=device)


def depth_from_logits(logits: Tensor, bins: Tensor, norm: str = DEFAULT_BIN_NORM) -> Tensor:
    """(B, bins, H, W) logits -> (B, H, W) depth: the bin centres weighted by ``norm`` (``probes.bin_norm``)."""
    return depth_from_bins(logits, bins, norm)


def silog_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Scale-invariant log loss sqrt(mean g² - λ (mean g)²), g = log pred - log target, on pixels with target > 0."""
    valid = (target > 0) & target.isfinite()
    if not valid.any():
        return pred.sum() * 0.0
    g = pred[valid].clamp(min=1e-6).log() - target[valid].log()
    return ((g * g).mean() - SILOG_LAMBDA * g.mean() ** 2).clamp(min=1e-12).sqrt()


def _size_groups(targets: Sequence[Tensor], batch_size: int, generator: torch.Generator) -> list[Tensor]:
    """Shuffled batches of indices whose targets share one size."""
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, target in enumerate(targets):
        by_size.setdefault(tuple(target.shape[-2:]), []).append(i)
    batches = []
    for indices in by_size.values():
        order = torch.tensor(indices)[torch.randperm(len(indices), generator=generator)]
        batches += list(order.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def fit_dense_head(maps: Tensor, targets: Sequence[Tensor], task: str, *, num_classes: int = 0,
                   ignore_index: int | None = None, min_depth: float = 1e-3, max_depth: float = 10.0,
                   epochs: int = 20, lr: float = 1e-2, weight_decay: float = 1e-4, batch_size: int = 16,
                   seed: int = 0, device: torch.device | str = "cpu") -> DenseHead:
    """Train a ``DenseHead`` on ``maps`` (N, D, rows, cols) against per-image ``targets`` (H_i, W_i)."""
    torch.manual_seed(seed)
    head = DenseHead(maps.shape[1], num_classes if task == "segmentation" else DEPTH_BINS).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    steps = epochs * len(_size_groups(targets, batch_size, torch.Generator().manual_seed(seed)))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, steps))
    bins = depth_bins(min_depth, max_depth, device)
    head.train()
    work = min(batch_size, len(targets)) * maps.shape[1] * head.linear.out_channels * maps.shape[2] * maps.shape[3]
    with threads_for(work, device):
        _train_head(head, optimizer, schedule, maps, targets, task, ignore_index, bins, epochs, batch_size,
                    generator, device)
    return head.eval()


def _train_head(head: DenseHead, optimizer: torch.optim.Optimizer, schedule: Any, maps: Tensor,
                targets: Sequence[Tensor], task: str, ignore_index: int | None, bins: Tensor, epochs: int,
                batch_size: int, generator: torch.Generator, device: torch.device | str) -> None:
    for _ in range(epochs):
        for batch in _size_groups(targets, batch_size, generator):
            x = maps[batch].to(device)
            y = torch.stack([targets[i] for i in batch.tolist()]).to(device)
            logits = head(x, tuple(y.shape[-2:]))
            if task == "segmentation":
                loss = F.cross_entropy(logits, y.long(), ignore_index=-100 if ignore_index is None else ignore_index)
            else:
                loss = silog_loss(depth_from_logits(logits, bins), y.float())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()


@torch.no_grad()
def iter_predictions(head: DenseHead, maps: Tensor, sizes: Sequence[tuple[int, int]], task: str, *,
                     min_depth: float = 1e-3, max_depth: float = 10.0, device: torch.device | str = "cpu",
                     windows: Windows | None = None) -> Iterator[Tensor]:
    """Per image, one at a time: class map (H, W) int64 or depth (H, W) float32 at the image's label size. With
    ``windows`` (placements and resized shapes from ``eval_windows``), ``maps`` are per window and are stitched."""
    bins = depth_bins(min_depth, max_depth, device)
    if windows is None:
        for i, size in enumerate(sizes):
            logits = head(maps[i : i + 1].to(device), tuple(size))
            yield (logits.argmax(1) if task == "segmentation" else depth_from_logits(logits, bins))[0].cpu()
        return
    placements, shapes, window = windows
    slots: dict[int, list[int]] = {}
    for slot, (index, _, _) in enumerate(placements):
        slots.setdefault(index, []).append(slot)
    for index, size in enumerate(sizes):
        chosen = slots[index]
        logits = head(maps[chosen].to(device), (window, window))
        outputs = logits if task == "segmentation" else depth_from_logits(logits, bins)[:, None]
        stitched = stitch(outputs, [placements[s][1:] for s in chosen], shapes[index], tuple(size))
        yield (stitched.argmax(0) if task == "segmentation" else stitched[0]).cpu()


def predict_dense(head: DenseHead, maps: Tensor, sizes: Sequence[tuple[int, int]], task: str, **options: Any
                  ) -> list[Tensor]:
    """``iter_predictions`` as a list."""
    return list(iter_predictions(head, maps, sizes, task, **options))


def score_dense(preds: Iterable[Tensor], data: DenseDataset, *, eigen_crop: bool = False, max_depth: float = 10.0
                ) -> dict[str, Any]:
    """Segmentation scores (one confusion matrix) or depth scores of ``preds`` against ``data.targets``."""
    if data.task == "segmentation":
        confusion = sum(confusion_matrix(p, t, data.num_classes, data.ignore_index)
                        for p, t in zip(preds, data.targets, strict=True))
        return segmentation_scores(confusion)
    return depth_scores(zip(preds, data.targets, strict=True), crop=eigen_crop, max_depth=max_depth)


def _trivial(train: DenseDataset, eval_set: DenseDataset, eigen_crop: bool, max_depth: float) -> dict[str, Any]:
    if train.task == "segmentation":
        counts = sum(torch.bincount(t[t != train.ignore_index].flatten().long() if train.ignore_index is not None
                                    else t.flatten().long(), minlength=train.num_classes) for t in train.targets)
        majority = int(counts.argmax())
        return score_dense([torch.full_like(t, majority) for t in eval_set.targets], eval_set)
    valid = torch.cat([t[t > 0].flatten() for t in train.targets])
    return score_dense([torch.full_like(t, float(valid.mean())) for t in eval_set.targets], eval_set,
                       eigen_crop=eigen_crop, max_depth=max_depth)


def dense_probe(model: nn.Module, train: DenseDataset, eval_set: DenseDataset, layers: str | Sequence[int | str]
                = "last", *, with_cls: Sequence[bool] = (False, True), epochs: int = 20, lr: float = 1e-2,
                eigen_crop: bool | None = None, min_depth: float = 1e-3, max_depth: float = 10.0, baseline: bool = True,
                label: str = "model", norm: bool = True, batch_size: int = 16, device: torch.device | str = "cpu",
                img_size: int | None = None, cache: Any = True, seed: int = 0, progress: bool = True,
                size: int | None = None, crops_per_image: int = 1) -> ProbeResult:
    """Segmentation or depth probe (by ``train.task``) per token layer, with and without CLS concatenated.

    ``size=None``: every image resized whole to the backbone's square input side. ``size=S``: images resized to
    short side S; training on ``crops_per_image`` random crops of the input side, evaluation by sliding window
    (stride two thirds of the window), see ``vitscope.probes.dense_windows``."""
    if train.task != eval_set.task:
        raise ValueError(f"train is a {train.task} set but eval a {eval_set.task} set")
    eigen_crop = eval_set.settings.get("eigen_crop", False) if eigen_crop is None else eigen_crop  # NYU: on
    wanted = parse_layers(layers, depth_of(model))
    if not len(train) or not len(eval_set):
        raise ValueError(f"dense probes need training and evaluation images; got {len(train)} and {len(eval_set)}")
    one = train.subset(1)
    side = model_input(model, one.model_view(min(one.images[0].shape[-2:])), img_size)[0]
    head_options = {"num_classes": train.num_classes, "ignore_index": train.ignore_index, "min_depth": min_depth,
                    "max_depth": max_depth, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed,
                    "device": device}
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, seed))] if baseline else [])
    sizes = [tuple(t.shape[-2:]) for t in eval_set.targets]
    windows: Windows | None = None
    fit_data, eval_view = train, eval_set.model_view(side)
    if size is not None:
        fit_data = train_crops(train, size, side, crops_per_image, seed)
        eval_view, placements, shapes = eval_windows(eval_set, size, side, max(1, side * 2 // 3))
        windows = (placements, shapes, side)
    rows = []
    for name, backbone in models:
        feats = [extract_features(backbone, view, wanted, norm=norm, batch_size=batch_size, device=device,
                                  img_size=img_size, cache=cache, progress=progress)
                 for view in (fit_data.model_view(side), eval_view)]
        for layer in wanted:
            for cls in with_cls:
                if cls and not feats[0][layer].has_cls:
                    continue
                head = fit_dense_head(patch_maps(feats[0][layer], cls), fit_data.targets, train.task,
                                      **head_options)
                preds = iter_predictions(head, patch_maps(feats[1][layer], cls), sizes, train.task,
                                         min_depth=min_depth, max_depth=max_depth, device=device, windows=windows)
                rows += _rows(name, layer, cls, score_dense(preds, eval_set, eigen_crop=eigen_crop,
                                                            max_depth=max_depth), eval_set)
    trivial = _trivial(train, eval_set, eigen_crop, max_depth)
    for layer in wanted:
        rows += _rows(CHANCE, layer, None, trivial, eval_set)
    return ProbeResult("segment" if train.task == "segmentation" else "depth", rows, {
        "model": label, "layers": wanted, "with_cls": list(with_cls), "epochs": epochs, "lr": lr, "norm": norm,
        "input_side": side, "train_images": len(train), "eval_images": len(eval_set), "eigen_crop": eigen_crop,
        "depth_range": [min_depth, max_depth], "bin_norm": DEFAULT_BIN_NORM, "seed": seed, "dataset": eval_set.name,
        "geometry": "whole image resized to the input side" if size is None else
        f"short side {size}, {crops_per_image} random crop(s) of {side} px, sliding window stride {side * 2 // 3}"})


def _rows(name: str, layer: int, with_cls: bool | None, scores: dict[str, Any], data: DenseDataset
          ) -> list[dict[str, Any]]:
    common = {"model": name, "layer": layer, "layer_kind": "token", "with_cls": with_cls, "n": len(data)}
    if data.task == "depth":
        return [row(**common, metric=metric, value=scores[metric])
                for metric in ("rmse", "rmse_pooled", "abs_rel", "delta1")]
    out = [row(**common, metric=metric, value=scores[metric]) for metric in ("miou", "pixel_accuracy")]
    out += [row(**common, group=cls, metric="iou", value=value)
            for cls, value in zip(data.classes, scores["iou"], strict=True)]
    return out
