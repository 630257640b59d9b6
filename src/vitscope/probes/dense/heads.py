"""Linear dense heads on cached patch tokens, every head of every layer trained in one pass over the features.

A head is a batch norm and a linear map, as before, but the batch norm normalises with the training set's
statistics, computed once per layer (``Standardiser``: what its running statistics converge to), instead of each
batch's; its learned scale and shift stay (``gamma``, ``beta``, trained with the linear map as before) and are
folded into the linear map at each step, so the heads of one layer read one standardised batch. Logits
(B, C, rows, cols). The CLS half of the linear map is the same at every patch, so it is one (B, C) term
added to the patch logits; the (B, 2D, rows, cols) concatenation is never built.

``fit_heads`` trains the heads of all layers (and of several backbones: ``dense_probe`` keys them by (backbone,
layer)) and both CLS settings together: every step draws one batch (and, with
point-sampled losses, one set of label points) and each head takes its own AdamW step on its own loss, exactly as
if trained alone with the same seed (same initialisation, same batches, same points), but features are read and
standardised once per layer and step, and the heads of one layer share one matrix product. Depth heads
normalise their bins on the patch grid upsampled x4 by default (DINOv2's head, ``vitscope.probes.dense.depth_grid``).
The inputs, statistics, head module and fused multi-head algebra are ``vitscope.probes.dense.modules``; this module
trains them (batching, the steps, the thread count).

Training runs a fixed number of optimiser steps (``steps``; ``epochs`` x batches per epoch when only epochs are
given), each head with its own learning rate and weight decay where ``hyper`` names them per head (a sweep trains
every candidate in the same pass), records every step's loss of every head and leaves each head's summary in
``head.fit_summary`` (``vitscope.probes.dense.training.HeadTraining``); ``progress`` shows a bar with the rate and
the time left.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from vitscope.memory import freed_memory_kept
from vitscope.metrics.dense import depth_valid
from vitscope.probes.dense.depth_grid import (
    DEFAULT_BIN_RESOLUTION,
    DEPTH_UPSAMPLE,
    check_bin_resolution,
    grid_depth,
    resize_depth,
)
from vitscope.probes.dense.modules import DenseHead, HeadInputs, Standardiser, stacked_table
from vitscope.probes.dense.points import (
    SILOG_LAMBDA,
    PointBatch,
    PointSampler,
    cells_at,
    depth_at,
    depth_last,
    point_cross_entropy,
    point_silog,
    rows_at,
)
from vitscope.probes.dense.training import steps_for, summarise
from vitscope.probes.linear import threads_for
from vitscope.threads import CoreShare

DEPTH_BINS = 256
Corners = tuple[Tensor, Tensor]  # PointBatch.corners(grid): (points, 4) cell indices and bilinear weights


@dataclass(frozen=True)
class _Plan:
    """How ``_train`` runs: the heads' ``with_cls`` settings, the point sampler (None: every pixel), the optimiser
    and its per-step schedule, the batch-order ``generator``, ``steps``, ``batch_size``, ``device``, the loss
    options (task, ignore index, depth bins, ``grid_bins``, the depth range) and whether to show ``progress``."""

    with_cls: Sequence[bool]
    sampler: PointSampler | None
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator
    steps: int
    batch_size: int
    device: torch.device | str
    loss_options: dict[str, Any]
    progress: bool = False


def depth_bins(min_depth: float, max_depth: float, device: torch.device | str = "cpu") -> Tensor:
    return torch.linspace(min_depth, max_depth, DEPTH_BINS, device=device)


def silog_loss(pred: Tensor, target: Tensor, min_depth: float = 1e-3, max_depth: float = 10.0) -> Tensor:
    """Scale-invariant log loss sqrt(mean g² - λ (mean g)²), g = log pred - log target, on the pixels the scores
    count (``depth_valid``: finite, ``min_depth`` < target <= ``max_depth``, metres)."""
    valid = depth_valid(target, min_depth, max_depth)
    if not valid.any():
        return pred.sum() * 0.0
    g = pred[valid].clamp(min=1e-6).log() - target[valid].log()
    return ((g * g).mean() - SILOG_LAMBDA * g.mean() ** 2).clamp(min=1e-12).sqrt()


def size_groups(targets: Sequence[Tensor], batch_size: int, generator: torch.Generator) -> list[Tensor]:
    """Shuffled batches of indices whose targets share one size."""
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, target in enumerate(targets):
        by_size.setdefault(tuple(target.shape[-2:]), []).append(i)
    batches = []
    for indices in by_size.values():
        order = torch.tensor(indices)[torch.randperm(len(indices), generator=generator)]
        batches += list(order.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def fit_heads(inputs: dict[Hashable, HeadInputs], targets: Sequence[Tensor], task: str, *,
              with_cls: Sequence[bool] = (False,), loss_points: int | None = 4096, num_classes: int = 0,
              ignore_index: int | None = None, min_depth: float = 1e-3, max_depth: float = 10.0,
              epochs: float | None = 20, steps: int | None = None, lr: float = 1e-2, weight_decay: float = 1e-4,
              hyper: Mapping[tuple[Hashable, bool], tuple[float, float]] | None = None, batch_size: int = 16,
              seed: int = 0, bin_resolution: str = DEFAULT_BIN_RESOLUTION, device: torch.device | str = "cpu",
              progress: bool = False) -> dict[tuple[Hashable, bool], DenseHead]:
    """Heads by (key, with_cls) trained on ``inputs`` by key (a layer, or any label: (backbone, layer)) against
    per-image ``targets`` (H_i, W_i), all in one pass (the same batches and points for every key):
    cross-entropy (segmentation) or the scale-invariant log loss of the bin-weighted depth (depth), at
    ``loss_points`` sampled pixels per image (``vitscope.probes.dense.points``) or, with None, at every pixel of
    the full-resolution upsampling (also when no label has more pixels than ``loss_points``). Depth bins are
    normalised on the patch grid upsampled x4 and the depth resized (``bin_resolution="x4"``, DINOv2's head) or at
    every label pixel (``"label"``), see ``vitscope.probes.dense.depth_grid``. CLS heads are skipped for layers without
    a CLS token.

    ``steps`` optimiser steps (AdamW, cosine schedule from the peak learning rate to 0); without ``steps``,
    ``epochs`` passes over the images (``steps_for``). Every head uses ``lr`` and ``weight_decay`` unless ``hyper``
    gives its own (lr, weight decay) by its key (key, with_cls); keys may share one ``HeadInputs`` (a sweep), whose
    statistics are then computed once. Each returned head carries its ``fit_summary`` (``HeadTraining``: the loss
    record)."""
    outputs = num_classes if task == "segmentation" else DEPTH_BINS
    grid_bins = task == "depth" and check_bin_resolution(bin_resolution) == "x4"
    heads: dict[tuple[Hashable, bool], DenseHead] = {}
    standardisers: dict[int, Standardiser] = {}
    groups = []
    for layer, layer_inputs in inputs.items():
        if id(layer_inputs) not in standardisers:
            standardisers[id(layer_inputs)] = Standardiser(layer_inputs).to(device)
        standardiser = standardisers[id(layer_inputs)]
        for cls in with_cls:
            if cls and layer_inputs.cls is None:
                continue
            torch.manual_seed(seed)  # each head starts as it would alone
            heads[layer, cls] = DenseHead(standardiser, layer_inputs.patches.shape[-1], outputs, cls).to(device)
        for cls in with_cls:
            if (layer, cls) in heads:
                chosen = (hyper or {}).get((layer, cls), (lr, weight_decay))
                groups.append({"params": list(heads[layer, cls].parameters()), "lr": float(chosen[0]),
                               "weight_decay": float(chosen[1])})
    optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    per_epoch = len(size_groups(targets, batch_size, torch.Generator().manual_seed(seed)))
    steps = steps_for(steps, None if steps is not None else epochs, per_epoch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, steps))
    generator = torch.Generator().manual_seed(seed)
    if loss_points is not None and loss_points >= max(t.numel() for t in targets):
        loss_points = None  # as many points as pixels: the exact full-resolution loss is no more work
    loss_options = {"task": task, "ignore_index": ignore_index, "bins": depth_bins(min_depth, max_depth, device),
                    "grid_bins": grid_bins, "depth_range": (min_depth, max_depth)}
    for head in heads.values():
        head.train()
    with threads_for(_step_work(inputs, targets, heads, loss_points, batch_size, grid_bins), device):
        with threads_for(0, "cpu"):  # counting and drawing pixels: small CPU work, one thread
            sampler = None if loss_points is None else PointSampler(
                targets, task, ignore_index, loss_points, torch.Generator().manual_seed(seed + 1),
                (min_depth, max_depth))
        # every step allocates the same large temporaries (reuse their pages); other processes may hold cores
        with freed_memory_kept(), CoreShare(device) as cores:
            losses = _train(heads, inputs, targets, _Plan(with_cls, sampler, optimizer, schedule, generator, steps,
                                                          batch_size, device, loss_options, progress), cores)
    for (key, head), group in zip(heads.items(), optimizer.param_groups, strict=True):
        head.fit_summary = summarise(losses[key], lr=group["initial_lr"], weight_decay=group["weight_decay"],
                                  batch_size=min(batch_size, len(targets)), images=len(targets))
    return {key: head.eval() for key, head in heads.items()}


def _step_work(inputs: dict[Hashable, HeadInputs], targets: Sequence[Tensor],
               heads: dict[tuple[Hashable, bool], DenseHead], loss_points: int | None, batch_size: int,
               grid_bins: bool = False) -> float:
    """Multiply-adds (roughly) of one layer's part of a training step (its ops are that size, whatever the number
    of layers): the linear maps and the loss at every read pixel (depth on the x4 grid: every cell of it)."""
    pixels = loss_points if loss_points is not None else max(t.numel() for t in targets)
    work: dict[Hashable, float] = {}
    for (layer, _), head in heads.items():
        patches = inputs[layer].patches
        if grid_bins:
            pixels = patches.shape[1] * DEPTH_UPSAMPLE**2
        work[layer] = work.get(layer, 0.0) + patches.shape[1] * patches.shape[2] * head.outputs \
            + pixels * head.outputs * 10
    return min(batch_size, len(targets)) * max(work.values(), default=0.0)


def _batches(targets: Sequence[Tensor], batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Batches without end: each pass over the images shuffled anew (``size_groups``)."""
    while True:
        yield from size_groups(targets, batch_size, generator)


def _train(heads: dict[tuple[Hashable, bool], DenseHead], inputs: dict[Hashable, HeadInputs], targets: Sequence[Tensor],
           plan: _Plan, cores: CoreShare) -> dict[tuple[Hashable, bool], Tensor]:
    """``plan.steps`` steps, each on the next batch: every head's loss backpropagated, one optimiser and schedule
    step, a ``cores`` tick. Returns each head's loss at every step (steps,)."""
    with_cls, sampler, optimizer, schedule = plan.with_cls, plan.sampler, plan.optimizer, plan.schedule
    device, loss_options = plan.device, plan.loss_options
    shared: dict[int, tuple[HeadInputs, list[tuple[Hashable, bool]]]] = {}  # heads by the inputs they read
    for key, one in inputs.items():
        shared.setdefault(id(one), (one, []))[1].extend((key, cls) for cls in with_cls if (key, cls) in heads)
    order = [(one, [heads[name] for name in names]) for one, names in shared.values() if names]
    names = [name for _, group in shared.values() for name in group]
    record = torch.zeros(plan.steps, len(names))
    batches = _batches(targets, plan.batch_size, plan.generator)
    bar = tqdm(range(plan.steps), unit="step", desc=f"dense heads ({len(names)})", disable=not plan.progress,
               dynamic_ncols=True, mininterval=1.0)
    for step in bar:
        batch = next(batches)
        indices = batch.tolist()
        with threads_for(0, "cpu"):
            points = sampler.batch(indices) if sampler is not None else None
            grid = next(iter(inputs.values())).grid
            if loss_options["grid_bins"]:  # points read the depth map on the x4 grid
                grid = (grid[0] * DEPTH_UPSAMPLE, grid[1] * DEPTH_UPSAMPLE)
            corners = points.corners(grid) if points is not None else None
        full = None if points is not None else torch.stack([targets[i] for i in indices]).to(device)
        optimizer.zero_grad(set_to_none=True)
        if points is not None and loss_options["task"] == "segmentation":
            record[step] = _segment_step(order, batch, points, corners, device)
        else:
            record[step] = torch.cat([_layer_step(group, one, batch, points, corners, full, device, loss_options)
                                      for one, group in order])
        optimizer.step()
        schedule.step()
        cores.tick()
        if plan.progress and (step % 20 == 0 or step == plan.steps - 1):
            bar.set_postfix(loss=f"{float(record[max(0, step - 19): step + 1].mean()):.3f}", refresh=False)
    bar.close()
    return {name: record[:, i] for i, name in enumerate(names)}


def _head_table(heads: list[DenseHead], inputs: HeadInputs, batch: Tensor, device: torch.device | str) -> Tensor:
    """One layer's batch standardised and through its heads: channel-last logits (B, P, heads, C)."""
    standardiser = heads[0].standardiser
    patches = standardiser.patches(inputs.patches[batch].to(device))
    cls = standardiser.cls(inputs.cls[batch].to(device)) if any(h.with_cls for h in heads) else None
    return stacked_table(heads, patches, cls)


def _segment_step(groups: list[tuple[HeadInputs, list[DenseHead]]], batch: Tensor, points: PointBatch,
                  corners: Corners, device: torch.device | str) -> Tensor:
    """Backpropagate the point-sampled losses of the segmentation heads of every layer at once (``groups``: the
    heads that read each layer's inputs): their logits side by side as channels, read at the points in one
    ``rows_at`` and scored by one cross-entropy. The summed loss is the sum of the per-head ones, so every head gets
    the gradient it would alone, for a few operations instead of a few per layer. Returns each head's loss
    (heads,), detached."""
    table = torch.cat([_head_table(group, one, batch, device).flatten(2) for one, group in groups], -1)
    sampled = rows_at(table, corners)  # (B, K, layers x heads x C)
    heads = sum(len(group) for _, group in groups)
    losses = point_cross_entropy(sampled.unflatten(-1, (heads, -1)), points, per_head=True)
    losses.sum().backward()
    return losses.detach().cpu()


def _layer_step(heads: list[DenseHead], inputs: HeadInputs, batch: Tensor, points: PointBatch | None,
                corners: Corners | None, full: Tensor | None, device: torch.device | str,
                options: dict[str, Any]) -> Tensor:
    """Backpropagate the losses of one layer's heads on one batch (gradients accumulate per head); returns each
    head's loss (heads,), detached."""
    table = _head_table(heads, inputs, batch, device)  # (B, P, heads, C)
    if options["grid_bins"]:
        return _grid_depth_step(len(heads), table.flatten(2).unflatten(1, inputs.grid), points, corners, full,
                                options)
    if points is not None:
        sampled = rows_at(table.flatten(2), corners).unflatten(-1, (len(heads), -1))  # (B, K, heads, C)
        losses = torch.stack([_point_loss(sampled[:, :, h], points, options) for h in range(len(heads))])
        losses.sum().backward()
        return losses.detach().cpu()
    logits = table.permute(0, 2, 3, 1).unflatten(-1, inputs.grid)  # (B, heads, C, rows, cols)
    values = []
    for h in range(len(heads)):  # one head's full-resolution graph at a time
        upsampled = F.interpolate(logits[:, h], size=tuple(full.shape[-2:]), mode="bilinear", align_corners=False)
        if options["task"] == "segmentation":
            ignore = options["ignore_index"]
            loss = F.cross_entropy(upsampled, full.long(), ignore_index=-100 if ignore is None else ignore)
        else:
            loss = silog_loss(depth_at(upsampled, options["bins"]), full.float(), *options["depth_range"])
        loss.backward(retain_graph=h < len(heads) - 1)
        values.append(loss.detach().cpu())
    return torch.stack(values)


def _grid_depth_step(heads: int, table: Tensor, points: PointBatch | None, corners: Corners | None, full: Tensor | None,
                     options: dict[str, Any]) -> Tensor:
    """Backpropagate the depth losses of ``heads`` heads from channel-last (B, rows, cols, heads * bins) logits:
    depth on the x4 grid, then resized to the label at the points (or at every pixel); returns each head's loss
    (heads,), detached."""
    depth = grid_depth(table, options["bins"])  # (B, 4 rows, 4 cols, heads)
    if points is not None:
        sampled = cells_at(depth.flatten(1, 2), corners)  # (B, K, heads)
        losses = [point_silog(sampled[..., h], points) for h in range(heads)]
    else:
        size = tuple(full.shape[-2:])
        losses = [silog_loss(resize_depth(depth[..., h], size), full.float(), *options["depth_range"])
                  for h in range(heads)]
    stacked = torch.stack(losses)
    stacked.sum().backward()
    return stacked.detach().cpu()


def _point_loss(logits: Tensor, points: PointBatch, options: dict[str, Any]) -> Tensor:
    if options["task"] == "segmentation":
        return point_cross_entropy(logits, points)
    return point_silog(depth_last(logits, options["bins"]), points)
