"""Per-step schedules and seeds: learning rate, weight decay, EMA momentum, data order and step seeds."""

from __future__ import annotations

import math

import torch


def cosine(start: float, end: float, progress: float) -> float:
    """Half-cosine from ``start`` (progress 0) to ``end`` (progress 1); progress is clipped to [0, 1]."""
    progress = min(1.0, max(0.0, progress))
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_multiplier(step: int, cfg, steps_per_epoch: int) -> float:
    """Linear warmup over ``warmup_epochs``, then cosine decay from ``lr`` to ``min_lr`` (a factor of ``lr``)."""
    warm = int(cfg.warmup_epochs * steps_per_epoch)
    total = cfg.epochs * steps_per_epoch
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def step_seed(seed: int, epoch: int, step: int, rank: int = 0) -> int:
    """The seed of one step's generator (augmentation, dropout) on one rank."""
    return (seed * 1_000_003 + epoch * 10_007 + step * 101 + rank) % (2**63 - 1)


def epoch_order(num_items: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's permutation of the training set (the same on every rank)."""
    return torch.randperm(num_items, generator=torch.Generator().manual_seed(step_seed(seed, epoch, -1)))
