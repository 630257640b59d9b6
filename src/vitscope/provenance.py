"""Provenance recorded in every run folder and results file."""

from __future__ import annotations

import datetime as dt
import platform
from typing import Any

import timm
import torch

from vitscope.version import __version__

SCHEMA_VERSION = 1


def device_description(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def provenance(*, config: dict[str, Any], seed: int | None, dataset: str | None, dataset_root: str | None,
               device: torch.device | str, started: dt.datetime | None = None) -> dict[str, Any]:
    """Versions, device, the resolved config and seed, the data, timestamps and the schema version."""
    now = dt.datetime.now(dt.UTC)
    return {
        "schema_version": SCHEMA_VERSION,
        "vitscope_version": __version__,
        "torch_version": torch.__version__,
        "timm_version": timm.__version__,
        "python_version": platform.python_version(),
        "device": device_description(device),
        "config": config,
        "seed": seed,
        "dataset": dataset,
        "dataset_root": dataset_root,
        "started": (started or now).isoformat(),
        "finished": now.isoformat(),
    }


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'; an unavailable GPU is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is unknown; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for but no CUDA GPU is visible; use --device cpu")
    return device
