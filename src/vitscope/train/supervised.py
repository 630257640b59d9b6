"""The supervised objective: a classifier trained with cross-entropy under a named protocol."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset, eval_batches
from vitscope.data.stream import StreamedDataset
from vitscope.data.worker_crops import PadCropCutter
from vitscope.models import VisionTransformer, load_weights
from vitscope.models import load as load_model
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext
from vitscope.train.objective import Objective, autocast
from vitscope.train.protocols import Protocol, soft_cross_entropy


@torch.no_grad()
def evaluate(model: nn.Module, dataset: ImageDataset, batch_size: int, ctx: DistContext, amp: str = "auto"
             ) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy on ``dataset``, each rank taking its share, reduced."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # correct, loss sum, count
    for images, labels in eval_batches(dataset, batch_size, ctx.device, rank=ctx.rank, world_size=ctx.world_size):
        with autocast(ctx.device, amp):
            logits = model(images).float()
        totals[0] += (logits.argmax(-1) == labels).sum()
        totals[1] += nn.functional.cross_entropy(logits, labels, reduction="sum")
        totals[2] += len(labels)
    ctx.all_reduce_sum(totals)
    model.train(was_training)
    count = max(float(totals[2]), 1.0)
    return {"top1": float(totals[0]) / count, "loss": float(totals[1]) / count}


def build_model(cfg: TrainConfig, train_set: ImageDataset, **extra: Any) -> VisionTransformer:
    """A vitscope ViT from ``cfg.model`` sized for ``train_set`` (classes, image size)."""
    options = {"num_classes": train_set.num_classes, "img_size": train_set.image_size, **extra, **cfg.model_options}
    model = load_model(cfg.model, **options)
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"training builds vitscope models; {cfg.model} is not one (use a preset such as vit-compact)")
    return model


class SupervisedObjective(Objective):
    """Classification: the protocol's augmentation and soft targets, then ``criterion(logits, targets)``."""

    name = "supervised"

    def __init__(self, cfg: TrainConfig, criterion: Callable[[Tensor, Tensor], Tensor] = soft_cross_entropy):
        super().__init__(cfg)
        if cfg.objective_options:
            raise ValueError(f"objective_options {sorted(cfg.objective_options)} do not apply to the supervised "
                             "objective; the protocol and its keys (label_smoothing, cutmix_alpha, ...) set it")
        self.criterion = criterion

    def setup(self, train_set: ImageDataset, eval_set: ImageDataset, ctx: DistContext) -> None:
        cfg = self.cfg
        self.ctx, self.eval_set = ctx, eval_set
        self.model = build_model(cfg, train_set).to(ctx.device)
        streamed = isinstance(train_set, StreamedDataset)  # then the workers cut the random crop
        self.protocol = Protocol(cfg.protocol, train_set.num_classes, train_set.mean, train_set.std,
                                 color_jitter_instead=cfg.dataset == "tiny-imagenet",
                                 crop_padding=0 if streamed else cfg.crop_padding,
                                 smoothing=cfg.label_smoothing, cutmix_alpha=cfg.cutmix_alpha,
                                 mixup_alpha=cfg.mixup_alpha)

    @property
    def trainable(self) -> nn.Module:
        return self.model

    @property
    def exported(self) -> VisionTransformer:
        return self.model

    def worker_cutter(self, train_set: StreamedDataset) -> PadCropCutter:
        return PadCropCutter(train_set.image_size, self.cfg.crop_padding, train_set.crop_pct)

    def loss(self, model: nn.Module, images: Tensor, labels: Tensor, indices: Tensor, epoch: int,
             generator: torch.Generator) -> Tensor:
        inputs, targets = self.protocol(images, labels, generator)
        with autocast(self.ctx.device, self.cfg.amp):
            return self.criterion(model(inputs), targets)

    def evaluate(self, ctx: DistContext, epoch: int) -> dict[str, float]:
        return evaluate(self.model, self.eval_set, self.cfg.batch_size, ctx, self.cfg.amp)

    def restore(self, checkpoint: Path, state: dict[str, Any]) -> None:
        load_weights(self.model, checkpoint / "model.safetensors")
