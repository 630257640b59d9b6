"""Floors that every probe table shows: the same architecture with random weights, and trivial predictors."""

from __future__ import annotations

import copy
import inspect

import torch
from torch import Tensor, nn


def random_twin(model: nn.Module, seed: int = 0) -> nn.Module:
    """A copy of ``model`` (same structure, normaliser, registers) re-initialised with the architecture's own
    scheme (``reset_parameters`` of leaves, then ``init_weights`` for timm or ``_init_weights`` for vitscope).
    Forward hooks are copied with the model, so a documented modification such as a planted outlier stays."""
    twin = copy.deepcopy(model)
    with torch.random.fork_rng():  # the caller's CPU and CUDA generators come back untouched
        torch.manual_seed(seed)
        for module in twin.modules():
            if hasattr(module, "reset_parameters") and module is not twin:
                module.reset_parameters()
        for name, param in twin.named_parameters(recurse=False):  # tokens held directly by the model
            if param is not None and name in ("cls_token", "reg_token", "pos_embed", "vitscope_registers"):
                nn.init.trunc_normal_(param, std=0.02)
        init = getattr(twin, "init_weights", None) or getattr(twin, "_init_weights", None)
        if callable(init):
            required = [p for p in inspect.signature(init).parameters.values() if p.default is p.empty]
            if required:  # a per-module initialiser (timm's PVT-v2: _init_weights(m))
                twin.apply(init)
            else:
                init()
    return twin.eval()


def majority_top1(train_labels: Tensor, eval_labels: Tensor) -> float:
    """Top-1 in [0, 1] of always predicting the most frequent training class; a ValueError when either side is
    empty (a token group too small to split into fitting and held-out tokens)."""
    if len(train_labels) == 0 or len(eval_labels) == 0:
        raise ValueError(f"a chance level needs examples on both sides (got {len(train_labels)} to fit and "
                         f"{len(eval_labels)} held out); use more images, or a larger minimum group size")
    majority = torch.as_tensor(train_labels).long().bincount().argmax()
    return float((torch.as_tensor(eval_labels).long() == majority).float().mean())


def mean_predictor_mse(train_targets: Tensor, eval_targets: Tensor) -> float:
    """MSE of always predicting the mean training target (per output)."""
    mean = torch.as_tensor(train_targets).double().reshape(len(train_targets), -1).mean(0)
    return float(((torch.as_tensor(eval_targets).double().reshape(len(eval_targets), -1) - mean) ** 2).mean())


def best_constant_distance(train_cells: Tensor, eval_cells: Tensor, distances: Tensor) -> float:
    """Mean distance (the units of ``distances``, (P, P) between cells) from the held-out ``eval_cells`` to the
    one cell that minimises the mean distance to the ``train_cells``: the best constant guess of a position probe,
    3.09 patches on a uniform 8 x 8 grid (the uniform random guess's 4.14 is no floor a probe must beat)."""
    if len(train_cells) == 0 or len(eval_cells) == 0:
        raise ValueError(f"a chance level needs positions on both sides (got {len(train_cells)} to fit and "
                         f"{len(eval_cells)} held out); use more images, or a larger minimum group size")
    distances = torch.as_tensor(distances).double()
    best = distances[:, torch.as_tensor(train_cells).long()].mean(1).argmin()
    return float(distances[best, torch.as_tensor(eval_cells).long()].mean())
