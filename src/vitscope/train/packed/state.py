"""Per-member pieces of a pack: the solo optimiser and schedule each member keeps (its checkpoint layout),
the members' learning-rate and weight-decay tables for the device, and per-member gradient clipping.

A pack optimises stacked parameters (K, *shape) with ``PackedAdamW``; each member also keeps the optimiser
and ``LambdaLR`` schedule its solo run builds, stepped on the host (no device work), whose ``state_dict``s
are what the member's checkpoints hold, so a packed run's checkpoint resumes solo and a solo checkpoint
resumes packed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from timm.optim import create_optimizer_v2
from torch import Tensor, nn

from vitscope.train.config import TrainConfig
from vitscope.train.loop import scheduled_weight_decay
from vitscope.train.schedules import lr_multiplier


def solo_optimizer(model: nn.Module, cfg: TrainConfig, steps_per_epoch: int
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimiser and schedule a solo run builds for ``model`` (timm's AdamW factory and its weight-decay
    groups, each marked ``scheduled_decay`` when its decay follows the weight-decay schedule; warmup + cosine
    lr), in the engine's order."""
    optimizer = create_optimizer_v2(model, opt="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg, steps_per_epoch))
    for group in optimizer.param_groups:
        group["scheduled_decay"] = group["weight_decay"] > 0
    optimizer._opt_called = True  # its updates run in the pack: no "scheduler before optimizer" warning
    return optimizer, scheduler


def schedule_tables(optimizers: Sequence[torch.optim.Optimizer], cfgs: Sequence[TrainConfig],
                    first_steps: Sequence[int], steps: int, steps_per_epoch: int) -> tuple[Tensor, Tensor]:
    """Learning rate and weight decay (steps, groups, K), float32 on the CPU, of each member's parameter
    groups for its next ``steps`` steps from ``first_steps[k]``: what its solo ``LambdaLR`` and weight-decay
    schedule set for those steps."""
    groups = len(optimizers[0].param_groups)
    lr = np.zeros((steps, groups, len(cfgs)), dtype=np.float32)
    wd = np.zeros_like(lr)
    for k, (optimizer, cfg, first) in enumerate(zip(optimizers, cfgs, first_steps, strict=True)):
        total = cfg.epochs * steps_per_epoch
        for t in range(steps):
            multiplier = lr_multiplier(first + t, cfg, steps_per_epoch)
            decay = scheduled_weight_decay(cfg, first + t, total)
            for g, group in enumerate(optimizer.param_groups):
                lr[t, g, k] = group["initial_lr"] * multiplier
                wd[t, g, k] = decay if decay is not None and group["scheduled_decay"] else group["weight_decay"]
    return torch.from_numpy(lr), torch.from_numpy(wd)


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``; on CUDA through pinned memory without blocking the host."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def clip_member_gradients(parameters: list[Tensor], max_norm: float | Tensor, mode: str) -> None:
    """Each member's gradients clipped as its solo run clips them, on stacked (K, ...) gradients and without
    a host synchronisation: ``global`` scales member k by max_norm_k / (norm_k + 1e-6) when below 1, norm_k
    over all of k's gradients (torch's clip_grad_norm_); ``per_tensor`` does so per tensor (DINO).
    ``max_norm``: one bound, or (K,) bounds on the device (inf: member not clipped)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norms = torch.stack([g.detach().flatten(1).norm(2, dim=1) for g in grads])  # (tensors, K)
    if mode == "global":
        norms = norms.norm(2, dim=0, keepdim=True).expand_as(norms)
    factors = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    for g, factor in zip(grads, factors, strict=True):
        g.mul_(factor.reshape(-1, *([1] * (g.ndim - 1))).to(g.dtype))
