"""How long a dense head trains and whether it got there: optimiser steps, the recorded training loss, and the
convergence check.

Heads are scheduled by optimiser steps, not epochs: 20 epochs over 171 images at batch 128 is 40 steps, far too
few for a linear head, and the same number of epochs means a different amount of training on every dataset.
``steps_for`` turns a number of epochs into steps where a caller still gives epochs.

Every step's loss of every head is kept (the point-sampled estimate each head was trained on); ``HeadTraining``
summarises it: the mean loss of the last 10 % of steps, a curve of ``CURVE_POINTS`` means, and the convergence
check. **Not converged** (``convergence``): the mean training loss over the last 10 % of steps is more than
``CONVERGED_WITHIN`` (relative) away from its mean over the 10 % of steps that end half-way through training
(below, as a head still descending; above, as one that diverged). Under
the cosine schedule the learning rate of the last 10 % is below 2.5 % of its peak, so the loss barely moves there
whatever the state of the head: the change over the whole second half is what tells a head that was still
descending when the schedule ran out from one that had settled. The 10 % threshold comes from measured curves
(segmentation heads on the real ViT-S/14's CamVid features, 1024 loss points): 20 epochs at batch 128 (40 steps)
fell 16-19 % over the second half; 500 steps at batch 16 fell 4-7 % at learning rates 1e-3 and 1e-2; 2000 steps at
1e-2 fell 2-4 %. At 0.1 the loss falls 8-16 % over the second half even at 2000 steps: a rate that high settles
only as the cosine schedule anneals, which the check also reports (a smaller rate, not more steps, is the fix).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

DEFAULT_STEPS = 1000  # optimiser steps of every dense head (batch 16): about 94 passes over 171 images
CURVE_POINTS = 50
WINDOW = 0.1  # the share of the steps each window of the convergence check averages
CONVERGED_WITHIN = 0.10  # relative drop of the training loss over the second half that still counts as settled


@dataclass(frozen=True)
class HeadTraining:
    """One head's training: ``steps`` at ``lr`` (peak, cosine to 0) and ``weight_decay``, ``batch_size`` images a
    step (``epochs`` passes over the ``images`` it was fitted on); ``final_loss`` the mean training loss of the last
    10 % of steps; ``change`` the relative drop over the second half (``convergence``); ``converged``; ``curve`` the
    mean loss of each of ``CURVE_POINTS`` equal stretches of steps."""

    steps: int
    lr: float
    weight_decay: float
    batch_size: int
    images: int
    epochs: float
    final_loss: float
    change: float
    converged: bool
    curve: list[float]

    def as_dict(self) -> dict:
        return asdict(self)


def steps_for(steps: int | None, epochs: float | None, batches_per_epoch: int, default: int = DEFAULT_STEPS) -> int:
    """Optimiser steps: ``steps`` when given, else ``epochs`` x ``batches_per_epoch`` (rounded, at least 1), else
    ``default``. Both given is an error (they would disagree)."""
    if steps is not None and epochs is not None:
        raise ValueError(f"give dense heads steps ({steps}) or epochs ({epochs}), not both")
    if steps is not None:
        if int(steps) < 1:
            raise ValueError(f"steps={steps} must be at least 1")
        return int(steps)
    if epochs is not None:
        if not epochs > 0:
            raise ValueError(f"epochs={epochs} must be positive")
        return max(1, round(epochs * batches_per_epoch))
    return default


def convergence(losses: Tensor) -> tuple[float, bool]:
    """(relative change, converged) of one head's per-step training losses (steps,): the change is
    (mean of the window ending half-way - mean of the last window) / mean of the last window, each window
    ``WINDOW`` of the steps (at least one step); converged when its size is at most ``CONVERGED_WITHIN``. Fewer than 20
    steps cannot be judged: NaN and False."""
    steps = len(losses)
    if steps < 20:
        return math.nan, False
    width = max(1, round(WINDOW * steps))
    half = steps // 2
    middle = float(losses[max(0, half - width): half].double().mean())
    last = float(losses[-width:].double().mean())
    change = (middle - last) / abs(last) if last else math.inf
    return change, bool(abs(change) <= CONVERGED_WITHIN)


def summarise(losses: Tensor, *, lr: float, weight_decay: float, batch_size: int, images: int) -> HeadTraining:
    """``HeadTraining`` of one head from its per-step losses (steps,)."""
    steps = len(losses)
    width = max(1, round(WINDOW * steps))
    change, converged = convergence(losses)
    chunks = torch.tensor_split(losses.double(), min(CURVE_POINTS, steps))
    curve = [round(float(chunk.mean()), 5) for chunk in chunks]
    return HeadTraining(steps, float(lr), float(weight_decay), int(batch_size), int(images),
                        round(steps * batch_size / max(1, images), 2), float(losses[-width:].double().mean()),
                        change, converged, curve)


def not_converged_line(trainings: dict[str, HeadTraining]) -> str:
    """One line naming the heads whose loss had not settled (``convergence``), '' when every head had."""
    late = {name: t for name, t in trainings.items() if not t.converged}
    if not late:
        return ""
    named = ", ".join(f"{name} ({t.change:+.1%})" if math.isfinite(t.change) else name for name in list(late)[:6]
                      for t in [late[name]])
    more = f" and {len(late) - 6} more" if len(late) > 6 else ""
    steps = next(iter(late.values())).steps
    return (f"{len(late)} of {len(trainings)} heads had not converged after {steps} steps (training loss still "
            f"moving by more than {CONVERGED_WITHIN:.0%} over the second half): {named}{more}; more --steps (or, "
            "where a high learning rate settles only as the schedule anneals, a smaller one) may help")
