"""Dense probes on frozen patch tokens: segmentation (mIoU) and depth (RMSE), layer by layer, with or without CLS.

Head: the patch-token map, optionally with the CLS token concatenated to every patch (D -> 2D), standardised with
the training set's statistics and read out by one linear map (``vitscope.probes.dense.heads``); its logits are
upsampled bilinearly to each label's own size (labels are only ever resized nearest-neighbour, with their training
crop). Training (``loss_points``, default 4096): the loss at that many label pixels per image sampled uniformly
from the valid ones, where the upsampling is evaluated exactly (``vitscope.probes.dense.points``; an unbiased
estimate of the full-resolution loss); ``"full"``: the loss over every pixel of the full-resolution upsampling.
All heads (every layer, with and without CLS) train in one pass over the cached features, for a fixed number of
optimiser steps (``vitscope.probes.dense.training``: the loss recorded, convergence checked). Each head's learning
rate and weight decay are chosen on the last part of the training split (``vitscope.probes.dense.sweep``), then
the chosen heads are refitted with one or more head seeds. Evaluation: every pixel of every label, computed in tiles
of label rows (``vitscope.probes.dense.tiles``), per image (``vitscope.probes.dense.evaluate``), so that scores and
differences carry intervals over images and seeds (``vitscope.probes.dense.intervals``) and claim S3 is judged per
layer (``vitscope.probes.dense.verdicts``). Layers default to ``spread`` (``spread_layers``).
Segmentation: cross-entropy with the dataset's ignore index; scores from one confusion matrix over the eval split
(``vitscope.metrics.dense``). Depth (DINOv2's linear head): 256 bins spaced linearly in [``min_depth``,
``max_depth``] metres, depth = the bin centres weighted by DINOv2's ``linear`` normalisation (ReLU + 0.1, divided by
the sum; ``vitscope.probes.dense.bin_norm``) on the patch grid upsampled x4, the depth map then resized to the label
(DINOv2's order, ``vitscope.probes.dense.depth_grid``; ``bin_resolution="label"``: at every label pixel),
scale-invariant log loss (λ = 0.85) on valid pixels; RMSE, abs-rel and
δ < 1.25 per image then averaged, and pooled RMSE, over ground truth in (1e-3, ``max_depth``], in NYU's Eigen crop
by default (``vitscope.metrics.dense``).

By default the backbone sees each image resized whole to its (square) input side; with ``size`` images are
resized to that short side, training uses random crops and evaluation a sliding window (``dense.windows``).
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
from vitscope.metrics.dense import confusion_matrix, depth_scores, depth_valid, segmentation_scores
from vitscope.probes.baselines import random_twin
from vitscope.probes.dense.bin_norm import DEFAULT_BIN_NORM
from vitscope.probes.dense.depth_grid import (
    DEFAULT_BIN_RESOLUTION,
    DEPTH_UPSAMPLE,
    check_bin_resolution,
    predict_depth_x4,
)
from vitscope.probes.dense.evaluate import depth_values, segment_confusions, segment_confusions_by_prediction
from vitscope.probes.dense.heads import DEPTH_BINS, DenseHead, HeadInputs, depth_bins, fit_heads, silog_loss
from vitscope.probes.dense.points import depth_at
from vitscope.probes.dense.scores import DenseProbeResult, best_layer, depth_rows, score_intervals, segment_rows
from vitscope.probes.dense.settings import DEFAULT_LOSS_POINTS, DenseProbeSettings
from vitscope.probes.dense.sweep import sweep
from vitscope.probes.dense.tiles import TILE_VALUES, predict_full
from vitscope.probes.dense.training import not_converged_line, steps_for
from vitscope.probes.dense.verdicts import cls_judgements, default_scope
from vitscope.probes.dense.windows import eval_windows, stitch, train_crops
from vitscope.probes.features import LayerFeatures, depth_of, extract_features, parse_layers
from vitscope.probes.linear import threads_for
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, row

EVAL_CHUNK = 16  # eval images whose low-resolution logits are computed together
DEFAULT_LAYERS = "spread"  # the dense probes' default layers (``spread_layers``)
SPREAD_COUNT = 5
# placements (image, y, x) of each window, resized (height, width) of each image, window side in pixels
Windows = tuple[list[tuple[int, int, int]], list[tuple[int, int]], int]
__all__ = ["DEPTH_BINS", "DenseHead", "DenseProbeResult", "DenseProbeSettings", "HeadInputs", "dense_layers",
           "dense_probe", "depth_at", "fit_dense_head", "fit_heads", "iter_predictions", "loss_points_of", "patch_maps",
           "predict_dense", "score_dense", "silog_loss", "spread_layers", "trivial_scores"]


def loss_points_of(value: int | str | None) -> int | None:
    """``"full"`` or None -> None (full-resolution loss); a positive int (or its text) -> points per image."""
    if value is None or str(value).strip().lower() == "full":
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--loss-points {value!r} is not a positive number of pixels per image; pass e.g. "
                         "4096, or 'full' for every pixel")
    return int(text)


def patch_maps(features: LayerFeatures, with_cls: bool) -> Tensor:
    """(N, D, rows, cols) float32 patch-token maps; with the CLS token concatenated, (N, 2D, rows, cols)."""
    patches = features.patches.float()
    if with_cls:
        if not features.has_cls:
            raise ValueError("this model has no CLS token to concatenate; probe without CLS")
        patches = torch.cat([patches, features.cls.float()[:, None].expand_as(patches)], dim=-1)
    n, _, d = patches.shape
    return patches.transpose(1, 2).reshape(n, d, *features.grid)


def fit_dense_head(maps: Tensor | HeadInputs, targets: Sequence[Tensor], task: str, *, with_cls: bool = False,
                   loss_points: int | str | None = DEFAULT_LOSS_POINTS, **options: Any) -> DenseHead:
    """One head on ``maps`` (N, D, rows, cols) or ``HeadInputs`` against per-image ``targets`` (H_i, W_i); the
    options of ``fit_heads`` (num_classes, ignore_index, epochs, lr, batch_size, seed, device, ...)."""
    inputs = HeadInputs.from_maps(maps) if isinstance(maps, Tensor) else maps
    return fit_heads({0: inputs}, targets, task, with_cls=(with_cls,), loss_points=loss_points_of(loss_points),
                     **options)[0, with_cls]


def _low_res(head: DenseHead, inputs: HeadInputs, index: Sequence[int], device: torch.device | str) -> Tensor:
    cls = inputs.cls[index] if head.with_cls else None
    return head.low_res(inputs.patches[index].to(device), cls, inputs.grid)


def _predict(logits: Tensor, size: tuple[int, int], task: str, bins: Tensor, tile_values: int, grid_bins: bool
             ) -> Tensor:
    """One image's (C, rows, cols) logits -> its (H, W) prediction."""
    if grid_bins:
        return predict_depth_x4(logits, size, bins)
    return predict_full(logits, size, task, bins, tile_values)


@torch.no_grad()
def iter_predictions(head: DenseHead, inputs: HeadInputs | Tensor, sizes: Sequence[tuple[int, int]], task: str, *,
                     min_depth: float = 1e-3, max_depth: float = 10.0, device: torch.device | str = "cpu",
                     windows: Windows | None = None, tile_values: int = TILE_VALUES,
                     bin_resolution: str = DEFAULT_BIN_RESOLUTION) -> Iterator[Tensor]:
    """Per image, one at a time: class map (H, W) int64 or depth (H, W) float32 at the image's label size, in
    tiles of label rows (depth with ``bin_resolution="x4"``: the x4 grid's depth map resized). With ``windows``
    (placements and resized shapes from ``eval_windows``), ``inputs`` are per window and are stitched."""
    inputs = HeadInputs.from_maps(inputs) if isinstance(inputs, Tensor) else inputs
    bins = depth_bins(min_depth, max_depth, device)
    grid_bins = task == "depth" and check_bin_resolution(bin_resolution) == "x4"
    if windows is None:
        for start in range(0, len(sizes), EVAL_CHUNK):
            logits = _low_res(head, inputs, list(range(start, min(len(sizes), start + EVAL_CHUNK))), device)
            for offset, one in enumerate(logits):
                yield _predict(one, tuple(sizes[start + offset]), task, bins, tile_values, grid_bins).cpu()
        return
    placements, shapes, window = windows
    slots: dict[int, list[int]] = {}
    for slot, (index, _, _) in enumerate(placements):
        slots.setdefault(index, []).append(slot)
    for index, size in enumerate(sizes):
        chosen = slots[index]
        logits = _low_res(head, inputs, chosen, device)
        if task == "segmentation":
            outputs = F.interpolate(logits, size=(window, window), mode="bilinear", align_corners=False)
        else:
            outputs = torch.stack([_predict(one, (window, window), task, bins, tile_values, grid_bins)
                                   for one in logits])
            outputs = outputs[:, None]
        stitched = stitch(outputs, [placements[s][1:] for s in chosen], shapes[index], tuple(size))
        yield (stitched.argmax(0) if task == "segmentation" else stitched[0]).cpu()


def predict_dense(head: DenseHead, inputs: HeadInputs | Tensor, sizes: Sequence[tuple[int, int]], task: str,
                  **options: Any) -> list[Tensor]:
    """``iter_predictions`` as a list."""
    return list(iter_predictions(head, inputs, sizes, task, **options))


def score_dense(preds: Iterable[Tensor], data: DenseDataset, *, eigen_crop: bool = False, min_depth: float = 1e-3,
                max_depth: float = 10.0) -> dict[str, Any]:
    """Segmentation scores (one confusion matrix) or depth scores of ``preds`` against ``data.targets``."""
    if data.task == "segmentation":
        confusion = sum(confusion_matrix(p, t, data.num_classes, data.ignore_index)
                        for p, t in zip(preds, data.targets, strict=True))
        return segmentation_scores(confusion)
    return depth_scores(zip(preds, data.targets, strict=True), crop=eigen_crop, min_depth=min_depth,
                        max_depth=max_depth)


def trivial_scores(train: DenseDataset, eval_set: DenseDataset, *, eigen_crop: bool = False, min_depth: float = 1e-3,
                   max_depth: float = 10.0) -> dict[str, Any]:
    """The floor a constant predictor sets: the majority class of ``train`` (segmentation) or the mean training
    depth over the pixels the scores count (``depth_valid``: finite, in (``min_depth``, ``max_depth``] metres),
    scored on ``eval_set``."""
    if train.task == "segmentation":
        counts = sum(torch.bincount(t[t != train.ignore_index].flatten().long() if train.ignore_index is not None
                                    else t.flatten().long(), minlength=train.num_classes) for t in train.targets)
        majority = int(counts.argmax())
        return score_dense([torch.full_like(t, majority) for t in eval_set.targets], eval_set)
    valid = torch.cat([t[depth_valid(t, min_depth, max_depth)].flatten().double() for t in train.targets])
    if not len(valid):
        raise ValueError(f"no training depth lies in ({min_depth}, {max_depth}] m; check the labels' unit or "
                         "pass the dataset's max_depth")
    return score_dense([torch.full_like(t, float(valid.mean())) for t in eval_set.targets], eval_set,
                       eigen_crop=eigen_crop, min_depth=min_depth, max_depth=max_depth)


def spread_layers(depth: int, count: int = SPREAD_COUNT) -> list[int]:
    """``count`` token layers spread evenly over 0..``depth`` (the embedding and the last layer included): the
    dense probes' default, so that a best layer in the middle is seen (12 blocks: 0, 3, 6, 9, 12)."""
    return sorted({round(i * depth / (count - 1)) for i in range(count)})


def dense_layers(layers: str | Sequence[int | str], depth: int) -> list[int]:
    """``parse_layers`` with ``"spread"`` (``spread_layers``) understood."""
    if isinstance(layers, str) and layers.strip().lower() == DEFAULT_LAYERS:
        return spread_layers(depth)
    return parse_layers(layers, depth)


def dense_probe(model: nn.Module, train: DenseDataset, eval_set: DenseDataset, layers: str | Sequence[int | str]
                = DEFAULT_LAYERS, settings: DenseProbeSettings | None = None) -> DenseProbeResult:
    """Segmentation or depth probe (by ``train.task``) per token layer, with and without CLS concatenated; what it
    fits and how is ``settings`` (``DenseProbeSettings``; the module docstring says what is computed). With both
    CLS settings, ``claims`` holds claim S3 judged per layer."""
    settings = settings or DenseProbeSettings()
    points = loss_points_of(settings.loss_points)
    resolution = check_bin_resolution(settings.bin_resolution)
    if train.task != eval_set.task:
        raise ValueError(f"train is a {train.task} set but eval a {eval_set.task} set")
    task = train.task
    eigen_crop = eval_set.settings.get("eigen_crop", False) if settings.eigen_crop is None else settings.eigen_crop
    depth_range = {"min_depth": settings.min_depth, "max_depth": settings.max_depth}
    wanted = dense_layers(layers, depth_of(model))
    if not len(train) or not len(eval_set):
        raise ValueError(f"dense probes need training and evaluation images; got {len(train)} and {len(eval_set)}")
    one = train.subset(1)
    side = model_input(model, one.model_view(min(one.images[0].shape[-2:])), settings.img_size)[0]
    label = settings.label
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, settings.seed))]
                                 if settings.baseline else [])
    sizes = [tuple(t.shape[-2:]) for t in eval_set.targets]
    windows: Windows | None = None
    fit_data, eval_view = train, eval_set.model_view(side)
    if settings.size is not None:
        fit_data = train_crops(train, settings.size, side, settings.crops_per_image, settings.seed)
        eval_view, placements, shapes = eval_windows(eval_set, settings.size, side, max(1, side * 2 // 3))
        windows = (placements, shapes, side)
    feats = {name: [extract_features(backbone, view, wanted, **settings.feature_options())
                    for view in (fit_data.model_view(side), eval_view)] for name, backbone in models}
    fit_inputs = {(name, layer): HeadInputs.of(feats[name][0][layer]) for name, _ in models for layer in wanted}
    eval_inputs = {(name, layer): HeadInputs.of(feats[name][1][layer]) for name, _ in models for layer in wanted}
    per_epoch = -(-len(fit_data) // settings.head_batch_size)
    steps = steps_for(settings.steps, settings.epochs, per_epoch)
    head_options = {"num_classes": train.num_classes, "ignore_index": train.ignore_index, **depth_range,
                    "steps": steps, "batch_size": settings.head_batch_size, "device": settings.device,
                    "loss_points": points, "with_cls": tuple(settings.with_cls), "bin_resolution": resolution,
                    "progress": settings.progress}
    predict_options = {**depth_range, "device": settings.device, "windows": windows,
                       "tile_values": settings.tile_values, "bin_resolution": resolution}

    def predict(head: DenseHead, inputs: HeadInputs, label_sizes: Sequence[tuple[int, int]]) -> Iterator[Tensor]:
        return iter_predictions(head, inputs, label_sizes, task, **{**predict_options, "windows": None})

    chosen = sweep(fit_inputs, fit_data.targets, task, settings.grid(), held_fraction=settings.held_fraction,
                   options={**head_options, "seed": settings.seed}, predict=predict,
                   depth_options={"crop": eigen_crop, **depth_range})
    fitted = [fit_heads(fit_inputs, fit_data.targets, task, hyper=chosen.chosen, seed=settings.seed + s,
                        **head_options) for s in range(settings.head_seeds)]
    result = DenseProbeResult("segment" if task == "segmentation" else "depth", [], task=task)
    for (name, layer), inputs in eval_inputs.items():
        keys = [cls for cls in settings.with_cls if (name, layer, cls) in _keys(fitted[0])]
        heads = [fitted[s][(name, layer), cls] for cls in keys for s in range(settings.head_seeds)]
        outcome = _per_image(heads, inputs, eval_set, sizes, task, windows, predict_options, eigen_crop,
                             depth_range)
        for i, cls in enumerate(keys):
            part = slice(i * settings.head_seeds, (i + 1) * settings.head_seeds)
            if task == "segmentation":
                result.per_image[name, layer, cls] = outcome[part]
                result.rows += segment_rows(name, layer, cls, outcome[part], eval_set.classes)
            else:
                values = {metric: v[part] for metric, v in outcome[0].items()}
                result.per_image[name, layer, cls] = (values, outcome[1])
                result.rows += depth_rows(name, layer, cls, values, outcome[1])
    trivial = trivial_scores(train, eval_set, eigen_crop=eigen_crop, **depth_range)
    for layer in wanted:
        result.rows += _rows(CHANCE, layer, None, trivial, eval_set)
    trainings = {f"{name} layer {layer}{' +CLS' if cls else ''}" + (f" seed {s}" if settings.head_seeds > 1 else ""):
                 head.fit_summary for s, heads in enumerate(fitted) for ((name, layer), cls), head in heads.items()}
    metric = "miou" if task == "segmentation" else "rmse"
    result.settings = {
        "model": label, "layers": wanted, "with_cls": list(settings.with_cls), "steps": steps,
        "epochs": round(steps * settings.head_batch_size / len(fit_data), 2), "head_batch_size":
        settings.head_batch_size, "head_seeds": settings.head_seeds, "seeds": [settings.seed + s for s in
                                                                             range(settings.head_seeds)],
        "sweep": {"lrs": list(settings.lrs), "weight_decays": list(settings.weight_decays),
                  "held_fraction": settings.held_fraction, **chosen.as_dict()},
        "norm": settings.norm, "input_side": side, "train_images": len(train), "eval_images": len(eval_set),
        "eigen_crop": eigen_crop, "depth_range": [settings.min_depth, settings.max_depth],
        "bin_norm": DEFAULT_BIN_NORM, "seed": settings.seed, "dataset": eval_set.name,
        **({"bin_resolution": resolution, "depth_head": _DEPTH_HEADS[resolution]} if task == "depth" else {}),
        "loss_points": "full" if points is None else points,
        "loss": "full-resolution, every valid pixel" if points is None else
        f"{points} uniformly sampled valid pixels per image (unbiased estimate of the full-resolution loss; "
        "every pixel when no label has more)",
        "geometry": "whole image resized to the input side" if settings.size is None else
        f"short side {settings.size}, {settings.crops_per_image} random crop(s) of {side} px, sliding window stride "
        f"{side * 2 // 3}",
        "heads": [{"head": name, **t.as_dict()} for name, t in trainings.items()],
        "best": best_layer(result.rows, label, metric)}
    result.settings["scores"] = score_intervals(result, settings.blocks)
    late = not_converged_line(trainings)
    result.settings["notes"] = [late] if late else []
    if set(settings.with_cls) == {False, True}:
        result.claims = cls_judgements(result, label, scope=default_scope(result, label), blocks=settings.blocks)
    return result


def _keys(heads: dict) -> set[tuple[Any, int, bool]]:
    return {(name, layer, cls) for (name, layer), cls in heads}


def _per_image(heads: list[DenseHead], inputs: HeadInputs, eval_set: DenseDataset, sizes: list[tuple[int, int]],
               task: str, windows: Windows | None, predict_options: dict[str, Any], eigen_crop: bool,
               depth_range: dict[str, float]) -> Any:
    """Per-image outcomes of ``heads`` on the evaluation set: (heads, images, C, C) confusions, or depth errors
    and scored pixel counts (``vitscope.probes.dense.evaluate``)."""
    def predict(head: DenseHead) -> Iterator[Tensor]:
        return iter_predictions(head, inputs, sizes, task, **predict_options)

    if task == "segmentation":
        if windows is None:
            with threads_for(heads[0].outputs * max(h * w for h, w in sizes), predict_options["device"]):
                return segment_confusions(heads, inputs, eval_set.targets, eval_set.num_classes,
                                          eval_set.ignore_index, device=predict_options["device"],
                                          tile_values=predict_options["tile_values"])
        return segment_confusions_by_prediction(heads, predict, eval_set.targets, eval_set.num_classes,
                                                eval_set.ignore_index)
    return depth_values(heads, predict, eval_set.targets, crop=eigen_crop, **depth_range)


_DEPTH_HEADS = {
    "x4": f"DINOv2's linear head: logits upsampled x{DEPTH_UPSAMPLE} from the patch grid, bins normalised there, "
          "the depth map resized bilinearly to the label",
    "label": "logits resized bilinearly to the label, bins normalised at every label pixel"}


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
