"""What a training method brings to the engine: an ``Objective``.

The engine (``vitscope.train.engine``) owns everything methods share: devices and DDP, autocast, compile,
the resumable loop, schedules, clipping, logging, checkpoints, signals, NaN stop and the progress bar. An
objective owns its models and their extra state, its batch augmentation, its loss, its evaluation and what
goes into a checkpoint. A new method is a new ``Objective`` subclass; the engine does not change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset
from vitscope.models import VisionTransformer
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext


def autocast(device: torch.device, amp: str):
    """bf16 autocast when ``amp`` is 'bf16', or 'auto' on CUDA; a disabled context otherwise."""
    enabled = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


class Objective(ABC):
    """A training method. The engine calls, in order: ``setup`` once; per step ``loss``, then
    ``before_optimizer_step`` and ``after_optimizer_step``; per epoch ``evaluate`` when due; ``state_dict`` at
    every checkpoint and ``restore`` on resume."""

    name: str = "objective"
    grad_clip_mode: str = "global"  # "global" (one norm over all parameters) or "per_tensor" (DINO)

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    @abstractmethod
    def setup(self, train_set: ImageDataset, eval_set: ImageDataset, ctx: DistContext) -> None:
        """Build the models on ``ctx.device`` (under the run's seed) and any state."""

    @property
    @abstractmethod
    def trainable(self) -> nn.Module:
        """The module whose parameters the optimiser updates (wrapped in DDP on several ranks)."""

    @property
    @abstractmethod
    def exported(self) -> VisionTransformer:
        """The model written as the run folder's ``model.safetensors`` (what analyses and probes load)."""

    def lr_scale(self) -> float:
        """Factor applied to ``cfg.lr`` and ``cfg.min_lr`` (DINO: global batch / 256)."""
        return 1.0

    @abstractmethod
    def loss(self, model: nn.Module, images: Tensor, labels: Tensor, indices: Tensor, epoch: int,
             generator: torch.Generator) -> Tensor:
        """The scalar loss of this rank's share of a batch; the objective enters ``autocast`` for its forward.

        ``model`` is ``trainable`` as the engine runs it (DDP / compiled); ``images`` uint8 (B, C, H, W),
        ``labels`` (B,), ``indices`` the images' positions in the training set (B,), ``generator`` the step's
        generator on the device."""

    def worker_cutter(self, train_set: Any) -> Any:
        """For a streamed training set: a picklable ``cutter(image, seed, epoch, index) -> crops`` that DataLoader
        workers apply to each decoded uint8 (3, H, W) image (``vitscope.data.worker_crops``); ``loss`` then gets
        the stacked crops as ``images``. None (the default): this objective needs whole images and cannot
        train on a streamed set."""
        return None

    def before_optimizer_step(self, epoch: int) -> None:
        """After backward and clipping, before the optimiser step (DINO freezes its last layer here)."""
        return None

    def after_optimizer_step(self, global_step: int, total_steps: int) -> None:
        """After the optimiser step (DINO updates its EMA teacher here)."""
        return None

    def step_scalars(self) -> dict[str, float]:
        """Extra scalars averaged into the train log lines since the last call (reset by the call)."""
        return {}

    @abstractmethod
    def evaluate(self, ctx: DistContext, epoch: int) -> dict[str, float]:
        """Evaluation scalars on the held-out split (every rank calls this; results are reduced)."""

    def state_dict(self) -> dict[str, Any]:
        """Extra state saved in the checkpoint's state.pt, beside the exported model's weights."""
        return {}

    @abstractmethod
    def restore(self, checkpoint: Path, state: dict[str, Any]) -> None:
        """Load the models and extra state from checkpoint folder ``checkpoint`` (and its ``state``)."""

    def summary(self) -> dict[str, Any]:
        """Objective-specific entries of summary.json."""
        return {}
