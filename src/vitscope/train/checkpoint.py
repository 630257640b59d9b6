"""Run checkpoints that survive a kill at any moment.

A checkpoint is a folder ``checkpoints/step-<N>/`` holding ``model.safetensors`` (weights and config) and
``state.pt`` (optimizer, scheduler, RNG and data-order state). It is written under a temporary name and
renamed when complete; then the pointer file ``checkpoints/LATEST`` is replaced atomically; only then are
older checkpoints removed. A reader therefore always finds a complete checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitscope.files import atomic_path, atomic_write_bytes
from vitscope.models import save_model
from vitscope.run_folder import LATEST, checkpoints_dir, model_file


def checkpoint_root(run_dir: str | Path) -> Path:
    return checkpoints_dir(run_dir)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_root(run_dir)
    pointer = root / LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if (candidate / "state.pt").is_file() and (candidate / "model.safetensors").is_file():
            return candidate
    complete = sorted(
        (p for p in root.glob("step-*") if p.is_dir() and (p / "state.pt").is_file()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    return complete[-1] if complete else None


def save_checkpoint(run_dir: str | Path, step: int, model: nn.Module, state: dict[str, Any], keep: int = 1) -> Path:
    """Write checkpoint ``step`` atomically and keep the newest ``keep`` ones."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:09d}"
    tmp = root / f".tmp-step-{step:09d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, tmp / "model.safetensors")
    with atomic_path(tmp / "state.pt") as state_file:
        torch.save(state, state_file)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_bytes(root / LATEST, final.name.encode())
    save_model(model, model_file(run_dir))  # the run folder's model to evaluate follows every checkpoint
    for old in sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def load_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
