"""The layout of a vitscope run folder; this module is its only owner.

    <run>/model.safetensors          the model to evaluate (weights + vitscope config; for DINO the teacher
                                     backbone), refreshed at every checkpoint and at the end
    <run>/summary.json               written when training finished
    <run>/checkpoints/step-<N>/      the trainer's resumable state: model.safetensors and state.pt
    <run>/checkpoints/LATEST         the name of the newest complete checkpoint folder

``vitscope.models.load(RUN_DIR)`` reads only the top level; the trainer reads and writes ``checkpoints/``.
"""

from __future__ import annotations

from pathlib import Path

MODEL_FILE = "model.safetensors"
SUMMARY_FILE = "summary.json"
CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
STATE_FILE = "state.pt"


def model_file(run_dir: str | Path) -> Path:
    """The run's model to evaluate."""
    return Path(run_dir) / MODEL_FILE


def summary_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / SUMMARY_FILE


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def latest_pointer(run_dir: str | Path) -> Path:
    """The file that names the newest complete checkpoint folder."""
    return checkpoints_dir(run_dir) / LATEST
