"""Batch sizes that fit in memory: read a plain ViT's sizes, estimate a job (``vitscope.memory``), then choose the
batch, or refuse in one line that names the estimate and the flag that makes it fit, before any work starts.

An asked batch size is kept when its estimate fits the budget's limit; otherwise the batch is the largest (up to
the job's default and the number of images) whose estimate fits the budget's plan (``vitscope.memory.budget``).
Models whose sizes cannot be read here (hierarchical, adapted) are not planned: their batch is the asked or default
one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitscope.attention import native
from vitscope.memory import ForwardShape, MemoryBudget, MemoryEstimate, gigabytes, memory_budget
from vitscope.memory.estimate import work_estimate
from vitscope.models import token_layout
from vitscope.models.capture.sites import token_blocks

FLAGS = {"batch_size": "--batch-size", "num_images": "--num-images", "img_size": "--img-size", "layers": "--layers"}
SMALLEST_SIDE = 112  # --img-size is not proposed below this many pixels


def forward_shape(model: nn.Module) -> ForwardShape | None:
    """The sizes of a plain ViT (vitscope's or timm's) at its built input size; None for other models."""
    try:
        layout = token_layout(model)
        blocks = len(token_blocks(model))
    except (ValueError, AttributeError, TypeError):
        return None
    width = getattr(model, "embed_dim", None) or getattr(model, "num_features", None)
    if not width or len(layout.grid_size) != 2 or layout.grid_size[0] != layout.grid_size[1]:
        return None
    heads = max((getattr(m, "num_heads", 0) for m in model.modules() if isinstance(getattr(m, "num_heads", 0), int)),
                default=0) or max(1, int(width) // 64)
    widest = max((m.out_features for m in model.modules() if isinstance(m, nn.Linear)), default=int(width))
    return ForwardShape(tokens=layout.num_prefix_tokens + math.prod(layout.grid_size), width=int(width),
                        widest=int(widest), heads=int(heads), blocks=blocks, patch=int(layout.patch_size),
                        prefix=int(layout.num_prefix_tokens))


def probabilities_formed(model: nn.Module, device: torch.device | str, work: str = "locality") -> bool:
    """Whether ``work`` forms a layer's attention probabilities for a whole batch: for locality, unless the attention
    is softmax and the native kernel computes MAD and entropy from queries and keys on ``device``; for the census,
    unless it is softmax (then it forms them image by image); never for norms and features."""
    if work not in ("locality", "census"):
        return False
    softmax = all(getattr(getattr(m, "normalizer", None), "is_softmax", True) for m in model.modules())
    if work == "census":
        return not softmax
    return not (softmax and native.runs_on(torch.empty(1, device=device)))


@dataclass(frozen=True)
class BatchPlan:
    """The chosen ``batch_size``, its ``estimate`` and the ``budget`` (None when the job was not planned)."""

    batch_size: int
    estimate: MemoryEstimate | None = None
    budget: MemoryBudget | None = None

    def line(self, what: str) -> str:
        """One line for the log: the batch, the estimate and the budget."""
        if self.estimate is None or self.budget is None:
            return f"{what}: batch {self.batch_size} (memory not estimated for this model)"
        return (f"{what}: batch {self.batch_size}, memory {self.estimate.describe(self.batch_size)}, within "
                f"{gigabytes(self.budget.limit)} ({self.budget.source})")


def plan_batch(model: nn.Module, work: str, num_images: int, batch_size: int | None = None, *, default: int = 64,
               device: torch.device | str = "cpu", layers: int = 1, kept_in_memory: bool = False,
               flags: dict[str, str] | None = None, budget: MemoryBudget | None = None) -> BatchPlan:
    """The batch size of ``work`` (locality, norms, census, features; ``vitscope.memory.estimate.work_estimate``)
    on ``num_images`` images: ``batch_size`` when given and it fits, else the largest that fits up to ``default``.
    A ValueError, one line with the estimate and the flag that fixes it (``flags`` renames them for a command),
    when nothing fits. ``budget`` defaults to ``vitscope.memory.memory_budget(device)``."""
    budget = budget or memory_budget(device)
    shape = forward_shape(model)
    count = max(int(num_images), 1)
    if shape is None or budget is None:
        return BatchPlan(batch_size or min(default, count))
    options = {"maps_formed": probabilities_formed(model, device, work), "layers": layers,
               "kept_in_memory": kept_in_memory}

    def estimate(shape_: ForwardShape = shape, images: int = count, **changes: Any) -> MemoryEstimate:
        return work_estimate(work, shape_, budget.in_use, images, **(options | changes))

    full = estimate()
    if batch_size is not None:
        if full.at(min(batch_size, count)) <= budget.limit:  # a batch beyond the images is all of them
            return BatchPlan(min(batch_size, count), full, budget)
    else:
        chosen = full.largest_batch(budget.plan, min(default, count)) or full.largest_batch(budget.limit, 1)
        if chosen:
            return BatchPlan(chosen, full, budget)
    asked = min(batch_size or 1, count)
    fixes = _fixes(estimate, shape, count, budget.limit, options["layers"] if work == "features" else None)
    names = FLAGS | (flags or {})
    words = " or ".join(f"{names[key]} {value}" for key, value in fixes) if fixes else None
    advice = (f"pass {words}" if words else f"no {names['batch_size']}, {names['img_size']} or "
              f"{names['num_images']} makes it fit: use a smaller model, or more memory")
    raise ValueError(f"{work} of this model at {shape.side} px would need {full.describe(asked)}, more than the "
                     f"{gigabytes(budget.limit)} it may use ({budget.source}); {advice}")


def _fixes(estimate, shape: ForwardShape, count: int, limit: int, layers: int | None) -> list[tuple[str, object]]:
    """The flags (key, value shown) each of which alone makes the job fit in ``limit`` bytes."""
    batch = estimate().largest_batch(limit, count)
    if batch:
        return [("batch_size", batch)]
    fixes = []
    kept = estimate(images=0)  # what the job keeps grows with the images: how many fit beside batch 1
    per_image = estimate(images=1).at(1) - kept.at(1)
    if per_image and 1 <= (limit - kept.at(1)) // per_image < count:
        fixes.append(("num_images", int((limit - kept.at(1)) // per_image)))
    if layers is not None and layers > 1:
        fixes += [("layers", f"naming at most {n} layers") for n in range(layers - 1, 0, -1)
                  if estimate(layers=n).at(1) <= limit][:1]
    sides = range(shape.side - shape.patch, max(SMALLEST_SIDE, shape.patch) - 1, -shape.patch)
    fixes += [("img_size", s) for s in sides if estimate(shape.at_side(s)).at(1) <= limit][:1]
    return fixes
