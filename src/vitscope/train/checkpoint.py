"""Run checkpoints that survive a kill at any moment, and a damaged file on disk.

A checkpoint is a folder ``checkpoints/step-<N>/`` holding ``model.safetensors`` (weights and config),
``state.pt`` (optimizer, scheduler, RNG, data-order and loss-window state) and, written last, ``SHA256SUMS``
(the sha256 of both). It is written under a temporary name and renamed when complete; then the pointer file
``checkpoints/LATEST`` is replaced atomically; only then are checkpoints older than the newest ``keep`` removed
(two by default). On resume the newest checkpoint whose files match their sums and whose state loads is used;
a damaged one is named in one line and the one before it is tried.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from vitscope.atomic_io import atomic_path, atomic_write_bytes, remove_stale_temporaries
from vitscope.models import save_model
from vitscope.run_folder import CHECKSUMS, LATEST, MODEL_FILE, STATE_FILE, checkpoints_dir, model_file

CHECKSUMMED = (MODEL_FILE, STATE_FILE)


class CheckpointDamaged(ValueError):
    """A checkpoint's files do not match their checksums, or its state does not load."""


def checkpoint_root(run_dir: str | Path) -> Path:
    return checkpoints_dir(run_dir)


CHECKPOINT_NAME = re.compile(r"step-(\d+)")  # step-<N>; other folders (step-8.bak, a user's copy) are not ours
STALE_TEMPORARY = r"\.tmp-step-\d+-(?P<pid>\d+)"  # save_checkpoint's folder before its rename


def _step(folder: Path) -> int:
    return int(folder.name.split("-")[1])


def _checkpoint_folders(root: Path) -> list[Path]:
    """The folders of ``root`` named ``step-<N>`` (anything else in ``checkpoints/`` is ignored)."""
    return [p for p in root.glob("step-*") if CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()]


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoint folders (both files present), newest first; the one ``LATEST`` names leads."""
    root = checkpoint_root(run_dir)
    found = sorted((p for p in _checkpoint_folders(root) if all((p / f).is_file() for f in CHECKSUMMED)),
                   key=_step, reverse=True)
    pointer = root / LATEST
    named = root / pointer.read_text().strip() if pointer.is_file() else None
    return sorted(found, key=lambda p: p != named)  # stable: the rest stay newest first


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None (not verified: see ``usable_checkpoint``)."""
    found = complete_checkpoints(run_dir)
    return found[0] if found else None


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def verify_checkpoint(checkpoint: Path) -> None:
    """A ``CheckpointDamaged`` naming the first file whose sha256 differs from ``SHA256SUMS`` (checkpoints
    written before sums existed have none and pass)."""
    sums = checkpoint / CHECKSUMS
    if not sums.is_file():  # no sums to check against: the model file must at least read whole
        _check_model_reads(checkpoint / MODEL_FILE)
        return
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name and _sha256(checkpoint / name) != digest:
            raise CheckpointDamaged(f"checkpoint file {checkpoint / name} is damaged (its sha256 differs from "
                                    f"{sums.name})")


def _check_model_reads(path: Path) -> None:
    """A ``CheckpointDamaged`` naming ``path`` when its safetensors header or tensors do not read (truncated)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                handle.get_tensor(key)
    except Exception as err:  # safetensors reports truncation as SafetensorError / OSError
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointDamaged(f"checkpoint file {path} is damaged and cannot be read ({detail})") from None


def save_checkpoint(run_dir: str | Path, step: int, model: nn.Module, state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically, with its checksums, and keep the newest ``keep`` ones."""
    root = checkpoint_root(run_dir)
    final = root / f"step-{step:09d}"
    tmp = root / f".tmp-step-{step:09d}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(model, tmp / MODEL_FILE)
        with atomic_path(tmp / STATE_FILE) as state_file:
            torch.save(state, state_file)
        atomic_write_bytes(tmp / CHECKSUMS, "".join(f"{_sha256(tmp / name)}  {name}\n"
                                                    for name in CHECKSUMMED).encode())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_bytes(root / LATEST, final.name.encode())
        save_model(model, model_file(run_dir))  # the run folder's model to evaluate follows every checkpoint
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno == errno.ENOSPC:  # the CLI names the folder and says the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root)) from None
        raise PermissionError(f"cannot write the checkpoint of step {step} in run folder {run_dir} "
                              f"({err.strerror or err}); make the folder writable (chmod -R u+w {run_dir}) and "
                              f"continue with `vitscope train --resume {run_dir}`, or train into another --out"
                              ) from None
    except BaseException:  # torch.save's own failures (a full disk: "enforce fail at inline_container.cc")
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in sorted(_checkpoint_folders(root), key=_step)[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    remove_stale_temporaries(root, STALE_TEMPORARY)
    return final


def load_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's ``state.pt``; a ``CheckpointDamaged`` naming the file when it does not load."""
    path = checkpoint / STATE_FILE
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch reports a truncated zip as PytorchStreamReader / unpickling errors
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointDamaged(f"checkpoint file {path} is damaged and cannot be read ({detail})") from None


def usable_checkpoint(run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(folder, state) of the newest checkpoint that verifies and loads, or None when there is none at all.
    Temporary checkpoint folders of writers no longer alive are removed first.

    Each damaged one is named in one line on stderr and the previous one is tried; when every checkpoint is
    damaged, a ``CheckpointDamaged`` names the newest one and the fix."""
    remove_stale_temporaries(checkpoint_root(run_dir), STALE_TEMPORARY)  # a killed writer's half checkpoint
    found = complete_checkpoints(run_dir)
    damage: list[str] = []
    for checkpoint in found:
        try:
            verify_checkpoint(checkpoint)
            state = load_state(checkpoint)
        except CheckpointDamaged as err:
            damage.append(str(err))
            continue
        for line in damage:
            print(f"vitscope: {line}; resuming from {checkpoint.name}, the newest intact one", file=sys.stderr)
        return checkpoint, state
    if damage:
        others = f" (as are the {len(damage) - 1} before it)" if len(damage) > 1 else ""
        raise CheckpointDamaged(f"{damage[0]}{others}, and no intact checkpoint is left; start the run afresh in "
                                "another --out")
    return None
