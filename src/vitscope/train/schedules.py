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


def fitted_warmup(warmup_epochs: float, epochs: int, preset_epochs: int) -> float:
    """A preset's warmup for a run of ``epochs``: unchanged when it fits (``warmup_epochs < epochs``), otherwise
    scaled with the run (the same share of it as of the preset's ``preset_epochs``), so that the run reaches its
    peak learning rate and then decays."""
    if warmup_epochs < epochs:
        return warmup_epochs
    return warmup_epochs * epochs / preset_epochs


def warmup_note(cfg) -> str | None:
    """One line when ``cfg``'s warmup does not fit in the run (the learning rate would never reach ``lr`` nor
    decay), naming both values and the fix; None when it fits."""
    if cfg.warmup_epochs < cfg.epochs:
        return None
    return (f"vitscope: warmup_epochs={cfg.warmup_epochs:g} is not shorter than epochs={cfg.epochs}: the learning "
            f"rate never reaches its peak lr={cfg.lr:g} and never decays; set warmup_epochs below epochs")


def images_per_epoch(images: int, batch_size: int) -> int:
    """Training images one epoch uses: full batches only (the engine and packs drop the last partial batch, so
    that every step of every run has the same shape and packed runs equal solo ones)."""
    return images // batch_size * batch_size


def epoch_note(images: int, batch_size: int) -> str | None:
    """One line when the last partial batch is left out of each epoch, saying how many images an epoch trains on;
    None when the batch divides the images."""
    used = images_per_epoch(images, batch_size)
    if used == images:
        return None
    return (f"vitscope: each epoch trains on {used} of the {images} training images ({used // batch_size} full "
            f"batches of {batch_size}); the {images - used} left over change with each epoch's shuffle")


def step_seed(seed: int, epoch: int, step: int, rank: int = 0) -> int:
    """The seed of one step's generator (augmentation, dropout) on one rank."""
    return (seed * 1_000_003 + epoch * 10_007 + step * 101 + rank) % (2**63 - 1)


def epoch_order(num_items: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's permutation of the training set (the same on every rank)."""
    return torch.randperm(num_items, generator=torch.Generator().manual_seed(step_seed(seed, epoch, -1)))
