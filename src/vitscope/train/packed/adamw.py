"""AdamW over a pack's stacked (K, ...) parameters, each member at its own step, lr and weight decay.

The update is torch's AdamW (decoupled weight decay, bias-corrected moments, as ``torch.optim.AdamW`` with
``amsgrad=False``), with the learning rate, weight decay and step count of member k taken from (K,) tensors
on the device, so members at different schedule positions share one optimiser step without a host read.
Each member's slice converts to and from the solo optimiser's ``state_dict`` (what a solo run's checkpoint
holds), so a packed member resumes solo and a solo checkpoint resumes packed.

The step runs on one flat (K, P) buffer (``flat=True``, the default): the parameters are re-homed as views of
it, their gradients gathered into one (K, P) tensor, and clipping and the update are a dozen whole-buffer
operations instead of about ten per parameter tensor (a small model's ~56 tensors made ~560 tiny operations a
step, each an OpenMP barrier, which cost more than the arithmetic on a shared CPU). The values equal the
per-tensor loop (``flat=False``, the readable twin) exactly: the same element-wise operations in the same order.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitscope.models.own.packed import PackedViT
from vitscope.train.packed.state import clip_member_gradients


class PackedAdamW:
    """AdamW over ``groups`` of stacked parameters (the solo optimiser's parameter groups, in its order).

    ``step(lr, weight_decay)`` takes (groups, K) tensors for the step; ``steps`` (K,) counts each member's
    optimiser steps (float32, as torch's ``step`` state). ``flat``: the parameters become views of one (K, P)
    buffer and the step runs on it whole (module docstring); ``exp_avg``/``exp_avg_sq`` map each parameter to
    its (K, *shape) moments either way."""

    def __init__(self, groups: list[list[nn.Parameter]], num_members: int, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, flat: bool = True):
        self.groups, self.betas, self.eps, self.num_members = groups, betas, eps, num_members
        device = groups[0][0].device
        self.steps = torch.zeros(num_members, device=device)
        self.flat = flat and all(p.ndim >= 1 and p.shape[0] == num_members and p.dtype == groups[0][0].dtype
                                 for p in self.params)
        if self.flat:
            self._make_flat()
        else:
            self.exp_avg = {p: torch.zeros_like(p) for params in groups for p in params}
            self.exp_avg_sq = {p: torch.zeros_like(p) for params in groups for p in params}

    @torch.no_grad()
    def _make_flat(self) -> None:
        """Re-home every parameter as a (K, *shape) view of one (K, P) buffer, moments alike."""
        K = self.num_members
        self.buffer = torch.cat([p.detach().reshape(K, -1) for p in self.params], dim=1)
        self.avg_buffer, self.avg_sq_buffer = torch.zeros_like(self.buffer), torch.zeros_like(self.buffer)
        self.exp_avg, self.exp_avg_sq = {}, {}
        start = 0
        for params in self.groups:
            for p in params:
                width = p[0].numel()
                columns = slice(start, start + width)
                p.data = self.buffer[:, columns].view(p.shape)
                self.exp_avg[p] = self.avg_buffer[:, columns].view(p.shape)
                self.exp_avg_sq[p] = self.avg_sq_buffer[:, columns].view(p.shape)
                start += width
        self.widths = [sum(p[0].numel() for p in params) for params in self.groups]

    def _columns(self, per_group: list[Tensor]) -> Tensor:
        """(K, P): each group's (K,) values repeated over its parameters' columns."""
        return torch.cat([value[:, None].expand(-1, width) for value, width in zip(per_group, self.widths,
                                                                                     strict=True)], dim=1)

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for params in self.groups for p in params]

    @torch.no_grad()
    def step(self, lr: Tensor, weight_decay: Tensor, max_norm: float | Tensor | None = None,
             clip_mode: str = "global") -> None:
        """One AdamW step of every member: ``lr`` and ``weight_decay`` (groups, K) for this step; with
        ``max_norm`` (one bound or (K,), inf: member not clipped), each member's gradients are first clipped as
        ``state.clip_member_gradients`` clips them (``clip_mode`` global or per_tensor)."""
        if not self.flat or any(p.grad is None for p in self.params):
            if max_norm is not None:
                clip_member_gradients(self.params, max_norm, clip_mode)
            return self._step_each(lr, weight_decay)
        if max_norm is not None and clip_mode != "global":
            clip_member_gradients(self.params, max_norm, clip_mode)
        grad = torch.cat([p.grad.reshape(self.num_members, -1) for p in self.params], dim=1)
        if max_norm is not None and clip_mode == "global":
            grad.mul_(torch.clamp(max_norm / (grad.norm(2, dim=1) + 1e-6), max=1.0)[:, None].to(grad.dtype))
        beta1, beta2 = self.betas
        self.steps += 1
        bias1 = 1 - beta1 ** self.steps
        bias2_sqrt = (1 - beta2 ** self.steps).sqrt()
        groups = range(len(self.groups))
        decay = self._columns([1 - lr[g] * weight_decay[g] for g in groups])
        step_size = self._columns([lr[g] / bias1 for g in groups])
        self.buffer.mul_(decay)
        self.avg_buffer.lerp_(grad, 1 - beta1)
        self.avg_sq_buffer.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (self.avg_sq_buffer.sqrt() / bias2_sqrt[:, None]).add_(self.eps)
        self.buffer.sub_(self.avg_buffer * step_size / denom)

    def _step_each(self, lr: Tensor, weight_decay: Tensor) -> None:
        """The per-tensor update (the flat step's readable twin; also where a parameter has no gradient)."""
        beta1, beta2 = self.betas
        self.steps += 1
        bias1 = 1 - beta1 ** self.steps
        bias2_sqrt = (1 - beta2 ** self.steps).sqrt()
        for g, params in enumerate(self.groups):
            decay, step_size = 1 - lr[g] * weight_decay[g], lr[g] / bias1
            for p in params:
                if p.grad is None:
                    continue
                view = (-1,) + (1,) * (p.ndim - 1)
                grad, exp_avg, exp_avg_sq = p.grad, self.exp_avg[p], self.exp_avg_sq[p]
                p.mul_(decay.view(view))
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq.sqrt() / bias2_sqrt.view(view)).add_(self.eps)
                p.sub_(exp_avg * step_size.view(view) / denom)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @classmethod
    def from_solo(cls, packed: PackedViT, solos: list[torch.optim.Optimizer], models: list[nn.Module],
                  flat: bool = True) -> PackedAdamW:
        """The packed optimiser of ``packed`` with ``solos[k]``'s state (possibly empty: a run before its first
        step) in member slot k; groups follow ``solos[0]``'s, matched to ``packed`` by parameter name."""
        defaults = solos[0].defaults
        if defaults.get("amsgrad") or defaults.get("maximize"):
            raise ValueError("packed training implements AdamW without amsgrad / maximize; train unpacked (--pack 1)")
        layouts = []
        for solo, model in zip(solos, models, strict=True):
            names = {id(p): name for name, p in model.named_parameters()}
            layouts.append([[names[id(p)] for p in group["params"]] for group in solo.param_groups])
        if any(layout != layouts[0] for layout in layouts):
            raise ValueError("pack members have different optimiser parameter groups (weight_decay 0 for some and "
                             "not others?); pack runs whose weight decay is either all zero or all non-zero")
        groups = [[packed.param(name) for name in names] for names in layouts[0]]
        optimizer = cls(groups, len(solos), betas=tuple(defaults["betas"]), eps=defaults["eps"], flat=flat)
        for k, (solo, model) in enumerate(zip(solos, models, strict=True)):
            optimizer.load_member(k, solo, model)
        return optimizer

    @torch.no_grad()
    def load_member(self, k: int, solo: torch.optim.Optimizer, model: nn.Module) -> None:
        """Member slot ``k`` from ``solo`` (an optimiser of ``model``), or zero state when ``solo`` has none."""
        steps = []
        for group, solo_group in zip(self.groups, solo.param_groups, strict=True):
            for stacked, param in zip(group, solo_group["params"], strict=True):
                state = solo.state.get(param)
                self.exp_avg[stacked][k] = state["exp_avg"] if state else 0
                self.exp_avg_sq[stacked][k] = state["exp_avg_sq"] if state else 0
                steps.append(float(state["step"]) if state else 0.0)
        if len(set(steps)) > 1:
            raise ValueError(f"member {k}'s optimiser state has parameters at different steps {sorted(set(steps))}; "
                             "a pack steps all of a member's parameters together")
        self.steps[k] = steps[0]

    @torch.no_grad()
    def write_member(self, k: int, solo: torch.optim.Optimizer) -> dict:
        """Member ``k``'s slice written into ``solo``'s state (its parameter groups are left as they are);
        returns ``solo.state_dict()``, the dictionary a solo run's checkpoint holds. Reads the step count."""
        solo.state.clear()
        step = self.steps[k].detach().cpu().clone()
        if float(step) == 0:
            return solo.state_dict()
        for group, solo_group in zip(self.groups, solo.param_groups, strict=True):
            for stacked, param in zip(group, solo_group["params"], strict=True):
                solo.state[param] = {"step": step.clone(), "exp_avg": self.exp_avg[stacked][k].clone(),
                                     "exp_avg_sq": self.exp_avg_sq[stacked][k].clone()}
        return solo.state_dict()

