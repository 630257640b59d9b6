"""Dense probes on frozen patch tokens: segmentation (mIoU) and depth (RMSE), layer by layer, with or without CLS.

Head: batch norm + 1x1 linear layer on the patch-token map (B, D, rows, cols), optionally with the CLS token
concatenated to every patch (D -> 2D), its output upsampled bilinearly to each label's own size (labels are never
resized). Segmentation: cross-entropy with the dataset's ignore index; scores from one confusion matrix over the
eval split (``vitscope.metrics.dense``). Depth (DINOv2's linear head): 256 bins spaced linearly in
[``min_depth``, ``max_depth``] metres, depth = softmax(logits)-weighted sum of bin centres, scale-invariant log
loss (λ = 0.85) on valid pixels; RMSE (mean of per-image RMSE), pooled RMSE, abs-rel and δ < 1.25.

The backbone sees each image resized to its input side (square); training uses every image whole (no random crops
or sliding windows in this version). Floors: the same probe on a randomly initialised backbone, and the trivial
predictor (the most frequent training class everywhere; the mean training depth everywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.analyze.inputs import model_input
from vitscope.data.dense import DenseDataset
from vitscope.metrics.dense import confusion_matrix, depth_scores, segmentation_scores
from vitscope.probes.baselines import random_twin
from vitscope.probes.features import LayerFeatures, depth_of, extract_features, parse_layers
from vitscope.probes.linear import threads_for
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row

DEPTH_BINS = 256
SILOG_LAMBDA = 0.85


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


def depth_from_logits(logits: Tensor, bins: Tensor) -> Tensor:
    """(B, bins, H, W) logits -> (B, H, W) depth: the softmax-weighted sum of the bin centres."""
    return torch.einsum("bkhw,k->bhw", logits.softmax(dim=1), bins)


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
def predict_dense(head: DenseHead, maps: Tensor, sizes: Sequence[tuple[int, int]], task: str, *,
                  min_depth: float = 1e-3, max_depth: float = 10.0, device: torch.device | str = "cpu"
                  ) -> list[Tensor]:
    """Per image: class map (H, W) int64 or depth (H, W) float32 at the image's label size."""
    bins = depth_bins(min_depth, max_depth, device)
    out = []
    for i, size in enumerate(sizes):
        logits = head(maps[i : i + 1].to(device), tuple(size))
        out.append((logits.argmax(1) if task == "segmentation" else depth_from_logits(logits, bins))[0].cpu())
    return out


def score_dense(preds: Sequence[Tensor], data: DenseDataset, *, eigen_crop: bool = False) -> dict[str, Any]:
    """Segmentation scores (one confusion matrix) or depth scores of ``preds`` against ``data.targets``."""
    if data.task == "segmentation":
        confusion = sum(confusion_matrix(p, t, data.num_classes, data.ignore_index)
                        for p, t in zip(preds, data.targets, strict=True))
        return segmentation_scores(confusion)
    return depth_scores(zip(preds, data.targets, strict=True), crop=eigen_crop)


def _trivial(train: DenseDataset, eval_set: DenseDataset, eigen_crop: bool) -> dict[str, Any]:
    if train.task == "segmentation":
        counts = sum(torch.bincount(t[t != train.ignore_index].flatten().long() if train.ignore_index is not None
                                    else t.flatten().long(), minlength=train.num_classes) for t in train.targets)
        majority = int(counts.argmax())
        return score_dense([torch.full_like(t, majority) for t in eval_set.targets], eval_set)
    valid = torch.cat([t[t > 0].flatten() for t in train.targets])
    return score_dense([torch.full_like(t, float(valid.mean())) for t in eval_set.targets], eval_set,
                       eigen_crop=eigen_crop)


def dense_probe(model: nn.Module, train: DenseDataset, eval_set: DenseDataset, layers: str | Sequence[int | str]
                = "last", *, with_cls: Sequence[bool] = (False, True), epochs: int = 20, lr: float = 1e-2,
                eigen_crop: bool = False, min_depth: float = 1e-3, max_depth: float = 10.0, baseline: bool = True,
                label: str = "model", norm: bool = True, batch_size: int = 16, device: torch.device | str = "cpu",
                img_size: int | None = None, cache: Any = True, seed: int = 0, progress: bool = True
                ) -> ProbeResult:
    """Segmentation or depth probe (by ``train.task``) per token layer, with and without CLS concatenated."""
    if train.task != eval_set.task:
        raise ValueError(f"train is a {train.task} set but eval a {eval_set.task} set")
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
    rows = []
    for name, backbone in models:
        feats = [extract_features(backbone, data.model_view(side), wanted, norm=norm, batch_size=batch_size,
                                  device=device, img_size=img_size, cache=cache, progress=progress)
                 for data in (train, eval_set)]
        for layer in wanted:
            for cls in with_cls:
                if cls and not feats[0][layer].has_cls:
                    continue
                head = fit_dense_head(patch_maps(feats[0][layer], cls), train.targets, train.task, **head_options)
                preds = predict_dense(head, patch_maps(feats[1][layer], cls), sizes, train.task,
                                      min_depth=min_depth, max_depth=max_depth, device=device)
                rows += _rows(name, layer, cls, score_dense(preds, eval_set, eigen_crop=eigen_crop), eval_set)
    trivial = _trivial(train, eval_set, eigen_crop)
    for layer in wanted:
        rows += _rows(CHANCE, layer, None, trivial, eval_set)
    return ProbeResult("segment" if train.task == "segmentation" else "depth", rows, {
        "model": label, "layers": wanted, "with_cls": list(with_cls), "epochs": epochs, "lr": lr, "norm": norm,
        "input_side": side, "train_images": len(train), "eval_images": len(eval_set), "eigen_crop": eigen_crop,
        "depth_range": [min_depth, max_depth], "seed": seed, "dataset": eval_set.name})


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
