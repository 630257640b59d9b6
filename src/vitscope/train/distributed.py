"""Optional multi-process training under torchrun; a single process never touches torch.distributed."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vitscope.provenance import resolve_device


@dataclass(frozen=True)
class DistContext:
    """Rank, world size and device of this process. ``enabled`` only under torchrun with WORLD_SIZE > 1."""

    rank: int
    world_size: int
    device: torch.device
    enabled: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def setup_distributed(device_name: str = "auto") -> DistContext:
    """Join the process group when launched by torchrun (one GPU per local rank, NCCL; gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(0, 1, resolve_device(device_name), False)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistContext(rank, world, device, True)
