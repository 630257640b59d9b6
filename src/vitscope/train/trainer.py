"""``train(cfg)``: pick the config's objective and run it on the engine.

The objectives are named here (``objective: supervised | dino``); the engine (``vitscope.train.engine``) never
names one, so a new objective is one class and one entry below.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from vitscope.run_folder import is_empty_but_lock, writer_lock
from vitscope.train.checkpoint import latest_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import setup_distributed
from vitscope.train.engine import EpochHook, TrainingDiverged, TrainingInterrupted, run
from vitscope.train.objective import Objective
from vitscope.train.protocols import soft_cross_entropy
from vitscope.train.supervised import SupervisedObjective, build_model, evaluate

__all__ = ["TrainingDiverged", "TrainingInterrupted", "build_model", "evaluate", "make_objective", "train"]


def make_objective(cfg: TrainConfig) -> Objective:
    """The objective named by ``cfg.objective``, configured by ``cfg.objective_options``."""
    if cfg.objective == "supervised":
        return SupervisedObjective(cfg, criterion=soft_cross_entropy)
    if cfg.objective == "dino":
        from vitscope.train.dino.objective import DinoObjective

        return DinoObjective(cfg)
    raise ValueError(f"objective={cfg.objective!r} is unknown; use supervised or dino")


def train(cfg: TrainConfig, *, resume: bool = False, hooks: list[EpochHook] | None = None) -> dict[str, Any]:
    """Train (or resume) the run described by ``cfg``; returns the summary also written to summary.json.

    ``hooks`` are called after every epoch with the exported model and return scalars to log (kind "epoch").
    """
    run_dir = Path(cfg.out)
    blocker = next((p for p in (run_dir, *run_dir.absolute().parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        what = "is an existing file" if blocker == run_dir else f"cannot be created ({blocker} is a file)"
        raise ValueError(f"run folder {run_dir} {what}, not a folder; pass a folder path as --out (it is created "
                         "if missing)")
    if resume and (run_dir / "summary.json").exists():
        return json.loads((run_dir / "summary.json").read_text())
    # one writer per run folder: the main rank holds its lock (the other ranks of a torchrun write nothing)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    created = not run_dir.exists()
    try:
        with writer_lock(run_dir, fix="choose another --out") if main_rank else nullcontext():
            objective = make_objective(cfg)
            ctx = setup_distributed(cfg.device)
            try:
                return run(cfg, objective, ctx, resume=resume, hooks=hooks)
            finally:
                ctx.close()
    except BaseException as err:
        if main_rank and created and (is_empty_but_lock(run_dir) or _refused_before_a_checkpoint(err, run_dir)):
            shutil.rmtree(run_dir, ignore_errors=True)  # refused before anything worth keeping: leave no folder
        raise


def _refused_before_a_checkpoint(err: BaseException, run_dir: Path) -> bool:
    """True when bad input (a ValueError, e.g. a damaged image met in a streamed run's first batch) stopped the run
    before its first checkpoint: its folder holds only a config and logs, nothing a resume could use."""
    if not isinstance(err, ValueError):  # divergence, interruption, a crash: their logs are kept
        return False
    return latest_checkpoint(run_dir) is None
