"""DINO's loss, centring and monitoring (Caron et al. 2021, ``main_dino.py`` ``DINOLoss``), as pure functions.

Shapes: ``student`` (V * B, K) head outputs for V views of B images, view-major (all images of view 0, then
view 1, ...); ``teacher`` (G * B, K) for the G global views, which are the student's first G views;
``centre`` (1, K).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitscope.train.distributed import DistContext


def teacher_temperature(epoch: int, warmup_temp: float, temp: float, warmup_epochs: int) -> float:
    """Linear warmup from ``warmup_temp`` (epoch 0) to ``temp`` (epoch ``warmup_epochs`` - 1), then constant
    (``np.linspace(warmup_temp, temp, warmup_epochs)`` followed by ``temp``)."""
    if epoch >= warmup_epochs:
        return temp
    if warmup_epochs == 1:
        return warmup_temp
    return warmup_temp + (temp - warmup_temp) * epoch / (warmup_epochs - 1)


def teacher_probabilities(teacher: Tensor, centre: Tensor, temperature: float) -> Tensor:
    """The centred, sharpened teacher distribution softmax((t - c) / temperature), (G * B, K)."""
    return F.softmax((teacher.float() - centre) / temperature, dim=-1)


def dino_loss(student: Tensor, teacher: Tensor, centre: Tensor, teacher_temp: float, student_temp: float = 0.1,
              global_views: int = 2) -> Tensor:
    """Mean over pairs (teacher view i, student view v != i) of the batch-mean cross-entropy
    ``-sum_k p_t[i] log softmax(s[v] / student_temp)``; the teacher side carries no gradient."""
    batch = teacher.shape[0] // global_views
    if batch < 1 or teacher.shape[0] % global_views or student.shape[0] % batch:
        raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} must stack whole views "
                         f"of one batch ({global_views} global views through the teacher)")
    targets = teacher_probabilities(teacher, centre, teacher_temp).detach().split(batch)
    log_probs = F.log_softmax(student.float() / student_temp, dim=-1).split(batch)
    total, terms = student.new_zeros((), dtype=torch.float32), 0
    for i, target in enumerate(targets):
        for v, log_prob in enumerate(log_probs):
            if v != i:
                total = total + torch.sum(-target * log_prob, dim=-1).mean()
                terms += 1
    return total / terms


@torch.no_grad()
def update_centre(centre: Tensor, teacher: Tensor, momentum: float, ctx: DistContext | None = None) -> Tensor:
    """EMA of the teacher's batch mean over all ranks: ``c * m + mean(t) * (1 - m)`` (1, K)."""
    batch_sum = teacher.float().sum(dim=0, keepdim=True)
    count = torch.tensor(float(teacher.shape[0]), device=teacher.device)
    if ctx is not None and ctx.enabled:
        ctx.all_reduce_sum(batch_sum)
        ctx.all_reduce_sum(count)
    return centre * momentum + batch_sum / count * (1 - momentum)


@torch.no_grad()
def collapse_monitors(teacher: Tensor, centre: Tensor, temperature: float) -> dict[str, float]:
    """Two collapse signals on the teacher's distribution p = softmax((t - c) / T), averaged over rows:
    ``teacher_entropy`` H(p) in nats (0: one-hot collapse; log K: uniform collapse) and ``kl_teacher_centre``
    KL(p || softmax(c / T)) in nats (0: the output is the centre alone, whatever the image)."""
    p = teacher_probabilities(teacher, centre, temperature)
    log_p = torch.log(p.clamp_min(1e-30))
    log_q = F.log_softmax(centre.float() / temperature, dim=-1)
    entropy = -(p * log_p).sum(dim=-1).mean()
    kl = (p * (log_p - log_q)).sum(dim=-1).mean()
    return {"teacher_entropy": float(entropy), "kl_teacher_centre": float(kl)}
