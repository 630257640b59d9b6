"""Where the engine's training batches come from: images held in memory, or streamed from disk.

The engine decides the order (``epoch_order``, sliced per step and rank) and hands each step's indices to a
batch source, which returns what the objective's ``loss`` takes as ``images``: full uint8 images from memory,
or, for a streamed set, the crops the objective's worker cutter cut in DataLoader processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from vitscope.data import ImageDataset
from vitscope.data.stream import StreamedDataset
from vitscope.data.worker_crops import Crops, cropped_batches
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext


def default_workers() -> int:
    return min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class MemoryBatches:
    """The whole uint8 set on the device, indexed per step (indices live on the device)."""

    def __init__(self, train_set: ImageDataset, ctx: DistContext):
        self.images, self.labels = train_set.images.to(ctx.device), train_set.labels.to(ctx.device)
        self.index_device = ctx.device

    def fetch(self, epoch: int, batches: Sequence[Tensor]) -> Iterator[tuple[Tensor, Tensor]]:
        for batch in batches:
            yield self.images[batch], self.labels[batch]


class StreamedBatches:
    """Images decoded and cut by the objective's ``cutter`` in ``workers`` DataLoader processes; the crops and
    labels move to the device as they arrive (indices stay on the host)."""

    def __init__(self, train_set: StreamedDataset, cutter: Any, cfg: TrainConfig, ctx: DistContext):
        self.train_set, self.cutter, self.seed, self.device = train_set, cutter, cfg.seed, ctx.device
        self.workers = cfg.data_workers if cfg.data_workers is not None else default_workers()
        self.index_device = torch.device("cpu")

    def fetch(self, epoch: int, batches: Sequence[Tensor]) -> Iterator[tuple[Crops, Tensor]]:
        pin = self.device.type == "cuda"
        for crops, labels, _ in cropped_batches(self.train_set, self.cutter, self.seed, epoch, batches,
                                                workers=self.workers, pin_memory=pin):
            moved = ([c.to(self.device, non_blocking=True) for c in crops] if isinstance(crops, list)
                     else crops.to(self.device, non_blocking=True))
            yield moved, labels.to(self.device, non_blocking=True)


def batch_source(train_set: ImageDataset | StreamedDataset, objective: Any, cfg: TrainConfig, ctx: DistContext
                 ) -> MemoryBatches | StreamedBatches:
    """The source for ``train_set``: in memory, or streamed through ``objective.worker_cutter`` (an error naming
    the fix when the objective needs full images)."""
    if not isinstance(train_set, StreamedDataset):
        return MemoryBatches(train_set, ctx)
    cutter = objective.worker_cutter(train_set)
    if cutter is None:
        raise ValueError(f"the {objective.name} objective needs whole images and cannot train on a streamed set; "
                         "use stream: false (or raise memory_budget_gb)")
    return StreamedBatches(train_set, cutter, cfg, ctx)
