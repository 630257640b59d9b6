"""Each pack member's optimiser state in a solo run's layout, and back.

A pack optimises stacked parameters (K, *shape) with one optimiser of the class and settings a solo run
uses (timm's ``create_optimizer_v2``, AdamW); its element-wise state slices into K solo states. A member's
checkpoint holds the solo optimiser's ``state_dict`` built from those slices, so a packed run's checkpoint
resumes solo and a solo checkpoint resumes packed.
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import torch
from timm.optim import create_optimizer_v2
from torch import Tensor, nn

from vitscope.models.packed import PackedViT
from vitscope.train.checkpoint import checkpoint_root
from vitscope.train.config import TrainConfig


def solo_optimizer(model: nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """The optimiser a solo run builds for ``model`` (timm's AdamW factory and its weight-decay groups, each
    group marked ``scheduled_decay`` when its decay follows the weight-decay schedule, as the engine does)."""
    optimizer = create_optimizer_v2(model, opt="adamw", lr=lr, weight_decay=cfg.weight_decay)
    for group in optimizer.param_groups:
        group["scheduled_decay"] = group["weight_decay"] > 0
    return optimizer


def packed_optimizer(packed: PackedViT, solo: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """An optimiser of ``solo``'s class and settings over ``packed``'s stacked parameters, with the same
    parameter groups in the same order (matched by parameter name)."""
    names = {id(p): name for name, p in model.named_parameters()}
    groups = [{**{k: v for k, v in group.items() if k != "params"},
               "params": [packed.param(names[id(p)]) for p in group["params"]]} for group in solo.param_groups]
    accepted = inspect.signature(type(solo)).parameters
    return type(solo)(groups, **{k: v for k, v in solo.defaults.items() if k in accepted and k != "params"})


def _member_value(value, k: int, shape: torch.Size):
    if isinstance(value, Tensor) and value.shape == shape:
        return value[k].detach().clone()
    return value.detach().clone() if isinstance(value, Tensor) else value


def member_state(packed_opt: torch.optim.Optimizer, solo: torch.optim.Optimizer, k: int) -> dict:
    """Member ``k``'s slice of ``packed_opt`` written into ``solo`` (built for member k's model); returns
    ``solo.state_dict()``, the dictionary a solo run's checkpoint holds."""
    solo.state.clear()
    for packed_group, solo_group in zip(packed_opt.param_groups, solo.param_groups, strict=True):
        solo_group.update({key: value for key, value in packed_group.items() if key != "params"})
        for stacked, param in zip(packed_group["params"], solo_group["params"], strict=True):
            state = packed_opt.state.get(stacked)
            if state:
                solo.state[param] = {key: _member_value(v, k, stacked.shape) for key, v in state.items()}
    return solo.state_dict()


def load_member_states(packed_opt: torch.optim.Optimizer, solos: list[torch.optim.Optimizer],
                       states: list[dict]) -> None:
    """Stack the members' solo optimiser ``states`` into ``packed_opt`` (group settings from member 0)."""
    for solo, state in zip(solos, states, strict=True):
        solo.load_state_dict(state)
    for g, packed_group in enumerate(packed_opt.param_groups):
        packed_group.update({key: value for key, value in solos[0].param_groups[g].items() if key != "params"})
        for i, stacked in enumerate(packed_group["params"]):
            params = [solo.param_groups[g]["params"][i] for solo in solos]
            if params[0] not in solos[0].state:
                continue
            stacked_state = {}
            for key, value in solos[0].state[params[0]].items():
                if isinstance(value, Tensor) and value.shape == params[0].shape:
                    stacked_state[key] = torch.stack([s.state[p][key] for s, p in zip(solos, params, strict=True)]
                                                     ).to(stacked.device)
                else:
                    stacked_state[key] = value.clone() if isinstance(value, Tensor) else value
            packed_opt.state[stacked] = stacked_state


def clip_member_gradients(parameters: list[Tensor], max_norm: float, mode: str) -> None:
    """Each member's gradients clipped as its solo run clips them, on stacked (K, ...) gradients and without
    a host synchronisation: ``global`` scales member k by max_norm / (norm_k + 1e-6) when below 1, norm_k
    over all of k's gradients (torch's clip_grad_norm_); ``per_tensor`` does so per tensor (DINO)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norms = torch.stack([g.detach().flatten(1).norm(2, dim=1) for g in grads])  # (tensors, K)
    if mode == "global":
        norms = norms.norm(2, dim=0, keepdim=True).expand_as(norms)
    factors = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    for g, factor in zip(grads, factors, strict=True):
        g.mul_(factor.reshape(-1, *([1] * (g.ndim - 1))).to(g.dtype))


def checkpoint_steps(run_dir: str | Path) -> set[int]:
    """Steps of the complete checkpoints in ``run_dir``."""
    return {int(p.name.split("-")[1]) for p in checkpoint_root(run_dir).glob("step-*")
            if (p / "state.pt").is_file() and (p / "model.safetensors").is_file()}


def common_checkpoint_step(run_dirs: list[Path]) -> int | None:
    """The newest step every member has a complete checkpoint of (members are written one after another,
    so a kill between them leaves some a checkpoint ahead), or None."""
    common = set.intersection(*(checkpoint_steps(d) for d in run_dirs)) if run_dirs else set()
    return max(common) if common else None


def prune_checkpoints(run_dir: Path, keep_step: int) -> None:
    """Remove every checkpoint of ``run_dir`` except ``step-<keep_step>`` (the solo layout keeps one)."""
    for folder in checkpoint_root(run_dir).glob("step-*"):
        if int(folder.name.split("-")[1]) != keep_step:
            shutil.rmtree(folder, ignore_errors=True)
