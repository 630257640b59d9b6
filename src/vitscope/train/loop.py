"""What every training loop shares: stop signals, the loss window and finite check, the weight-decay
schedule, checkpoint state, end-of-epoch records, and the run folder's config and summary.

The engine (``vitscope.train.engine``, one objective) and packed training (``vitscope.train.packed.train``, K runs
at their own steps) both build their loops from these pieces, so a packed member's run folder is written by
the same code as a solo run's.
"""

from __future__ import annotations

import datetime as dt
import importlib
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitscope.atomic_io import write_json
from vitscope.models import VisionTransformer, save_model
from vitscope.provenance import provenance
from vitscope.train.checkpoint import latest_checkpoint, usable_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.logging import MetricsLog
from vitscope.train.schedules import cosine

EpochHook = Callable[[nn.Module], dict[str, Any]]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM arrived; a checkpoint was written first."""


class StopFlag:
    """Turns SIGINT / SIGTERM into a flag checked between steps; restores the old handlers on exit."""

    def __init__(self):
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame):
        self.signal = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def interrupted(self, step: int, how_to_continue: str) -> TrainingInterrupted:
        """The error to raise once the checkpoint of ``step`` is written."""
        name = signal.Signals(self.signal).name if self.signal is not None else "a signal"
        return TrainingInterrupted(f"stopped by {name} at step {step}; checkpoint written; {how_to_continue}")


def prepare_run(cfg: TrainConfig, resume: bool) -> tuple[Path, dict[str, Any] | None]:
    """The run folder and, when resuming, its latest checkpoint's state (with its ``path``); refuses to start
    afresh in a folder that already holds a run."""
    run_dir = Path(cfg.out)
    if not resume:
        if latest_checkpoint(run_dir) is not None or (run_dir / "summary.json").exists():
            raise ValueError(f"run folder {run_dir} already holds a run; continue it with --resume {run_dir} "
                             "or choose another --out")
        return run_dir, None
    found = usable_checkpoint(run_dir)  # verified; a damaged newest one falls back to the one before
    return run_dir, (found[1] | {"path": str(found[0])}) if found else None


def check_splits(train_set: Any, eval_set: Any, cfg: TrainConfig) -> None:
    """A ValueError, before anything trains or is written, when the two splits do not share their classes (in
    the same order: label k must mean one class in both)."""
    train_classes, eval_classes = list(train_set.classes), list(eval_set.classes)
    if train_classes != eval_classes:
        only = ", ".join(map(str, sorted(set(train_classes) ^ set(eval_classes))[:5])) or "none, the order differs"
        where = f"{cfg.dataset} in {cfg.data_dir}" if cfg.data_dir else cfg.dataset
        raise ValueError(f"the train and eval splits of {where} have different classes ({len(train_classes)} and "
                         f"{len(eval_classes)}; in one split only: {only}); give both splits the same class folders")


def resolve_hook(name: str) -> EpochHook:
    """``module:function`` -> the function (an epoch hook named in the config's ``epoch_hooks``)."""
    module_name, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"epoch hook {name!r} not found; name it as module:function, e.g. "
                         "vitscope.attention:learned_alphas") from None


def flatten_scalars(values: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested dicts, tensors and sequences of numbers -> flat ``{'a/b/0': float}``."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= flatten_scalars(value, f"{name}/")
        elif isinstance(value, torch.Tensor) and value.numel() > 1 or isinstance(value, list | tuple):
            items = value.detach().flatten().tolist() if isinstance(value, torch.Tensor) else list(value)
            flat |= {f"{name}/{i}": float(v) for i, v in enumerate(items)}
        else:
            flat[name] = float(value)
    return flat


def hook_scalars(hooks: list[EpochHook], model: nn.Module) -> dict[str, float]:
    """Every hook's scalars for ``model``, flattened. A hook returns a mapping of names to numbers / tensors /
    sequences, or one such value, logged under the hook's name (e.g. ``learned_alphas/3`` for head 3)."""
    scalars: dict[str, float] = {}
    for hook in hooks:
        name = getattr(hook, "__name__", type(hook).__name__)
        values = hook(model)
        if not isinstance(values, dict):
            values = {name: values}
        try:
            scalars |= flatten_scalars(values)
        except (TypeError, ValueError):
            raise TypeError(f"epoch hook {name} returned {type(values).__name__} holding something other than "
                            "numbers; return a mapping of names to numbers or tensors") from None
    return scalars


def scheduled_weight_decay(cfg: TrainConfig, global_step: int, total_steps: int) -> float | None:
    """The weight decay of the decayed parameter groups at ``global_step`` (cosine from ``weight_decay`` to
    ``weight_decay_end``), or None when the config keeps it constant."""
    if cfg.weight_decay_end is None:
        return None
    return cosine(cfg.weight_decay, cfg.weight_decay_end, global_step / total_steps)


def apply_weight_decay(optimizer: torch.optim.Optimizer, cfg: TrainConfig, global_step: int,
                       total_steps: int) -> None:
    """Set the ``scheduled_decay`` groups' weight decay for the step about to run."""
    decay = scheduled_weight_decay(cfg, global_step, total_steps)
    if decay is not None:
        for group in (g for g in optimizer.param_groups if g["scheduled_decay"]):
            group["weight_decay"] = decay


def check_finite(value: float, global_step: int, run_dir: Path, lr: float) -> None:
    """A ``TrainingDiverged`` naming the last good checkpoint when ``value`` is NaN or infinite."""
    if not math.isfinite(value):
        kept = latest_checkpoint(run_dir)
        raise TrainingDiverged(f"loss of {run_dir} became {value} near step {global_step}; the last good checkpoint "
                               f"{kept or '(none yet)'} is kept; lower lr (now {lr}) or keep grad_clip > 0")


class LossWindow:
    """The losses summed on the device since the last train log line (no host read per step), with the
    step count and wall time of the window."""

    def __init__(self, device: torch.device | str):
        self.running = torch.zeros((), device=device)
        self.steps = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self.running += loss.detach()
        self.steps += 1

    def state_dict(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, Any]:
        """The open window (its exact sum, over ranks with ``reduce``, and step count), kept in a checkpoint so
        that the first log line after a resume averages the same steps as an uninterrupted run's."""
        total = reduce(self.running.clone()) if reduce is not None else self.running
        return {"running": total.detach().cpu().clone(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any] | None, holds_sum: bool = True) -> None:
        """Continue the window a checkpoint kept (None: a checkpoint from before windows were kept); under DDP
        one rank (``holds_sum``) takes the sum over ranks and the others start theirs at 0."""
        if state is not None:
            self.running.copy_(state["running"].to(self.running.device) if holds_sum else 0)
            self.steps = int(state["steps"])

    def due(self, every: int, end_of_epoch: bool) -> bool:
        return self.steps >= every or end_of_epoch

    def pending(self) -> float:
        """The window's loss sum read back (0 for an empty window): finite-checked before a checkpoint."""
        return float(self.running) if self.steps else 0.0

    def take(self, images_per_step: int, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
             world_size: int = 1) -> tuple[float, float]:
        """(mean loss over the window and ranks, images/s of this rank's window); starts a new window."""
        total = reduce(self.running.clone()) if reduce is not None else self.running
        mean = float(total) / (self.steps * world_size)
        rate = self.steps * images_per_step / (time.perf_counter() - self.start)
        self.running.zero_()
        self.start, self.steps = time.perf_counter(), 0
        return mean, rate


def train_record(global_step: int, epoch: int, loss: float, lr: float, rate: float,
                 extra: dict[str, float] | None = None) -> dict[str, Any]:
    """One ``kind: train`` line of metrics.jsonl."""
    return {"kind": "train", "step": global_step, "epoch": epoch + 1, "loss": loss, "lr": lr, "images_per_s": rate,
            **(extra or {})}


def trainer_state(*, optimizer_state: dict, scheduler_state: dict, global_step: int, steps_per_epoch: int,
                  cfg: TrainConfig, rng: torch.Tensor, objective_state: dict[str, Any],
                  loss_window: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint's state.pt holds (the same keys for solo and packed runs)."""
    return {"optimizer": optimizer_state, "scheduler": scheduler_state, "global_step": global_step,
            "epoch": global_step // steps_per_epoch, "step_in_epoch": global_step % steps_per_epoch,
            "seed": cfg.seed, "rng": {"torch": rng}, "config": cfg.to_dict(), "objective": objective_state,
            "loss_window": loss_window}


def keep_every(cfg: TrainConfig) -> int:
    """Epochs between kept model snapshots (``keep_every``, or 10 % of the run)."""
    return cfg.keep_every if cfg.keep_every is not None else max(1, round(cfg.epochs / 10))


def epoch_records(log: MetricsLog, cfg: TrainConfig, *, epoch: int, global_step: int, total_steps: int,
                  evaluate: Callable[[], dict[str, float]], model: VisionTransformer, hooks: list[EpochHook],
                  run_dir: Path, is_main: bool = True) -> dict[str, float] | None:
    """End of epoch ``epoch`` (0-based): evaluation when due (logged; returned when the evaluation gave
    anything), hook scalars, and the kept snapshot of ``model``."""
    result = None
    if (epoch + 1) % cfg.eval_every == 0 or global_step == total_steps:
        result = evaluate() or None  # an objective may skip epochs (DINO's knn_every)
        if result:
            log.write({"kind": "eval", "step": global_step, "epoch": epoch + 1, **result})
    if hooks and is_main:
        log.write({"kind": "epoch", "step": global_step, "epoch": epoch + 1, **hook_scalars(hooks, model)})
    if is_main and ((epoch + 1) % keep_every(cfg) == 0 or global_step == total_steps):
        save_model(model, run_dir / "snapshots" / f"epoch-{epoch + 1:04d}.safetensors")
    return result


def run_provenance(cfg: TrainConfig, device: torch.device, started: dt.datetime,
                   subsets: dict[str, Any]) -> dict[str, Any]:
    return provenance(config=cfg.to_dict(), seed=cfg.seed, dataset=cfg.dataset, dataset_root=cfg.data_dir,
                      device=device, started=started, subsets=subsets)


def write_run_config(run_dir: Path, cfg: TrainConfig, device: torch.device, started: dt.datetime,
                     subsets: dict[str, Any], world_size: int, steps_per_epoch: int,
                     data: dict[str, Any] | None = None) -> None:
    """The run folder's config.json: provenance, world size, steps per epoch and, when given, how each split
    was read (``data``: split -> {stream, reason, ...})."""
    extra = {"data": data} if data is not None else {}
    write_json(run_dir / "config.json", run_provenance(cfg, device, started, subsets)
               | {"world_size": world_size, "steps_per_epoch": steps_per_epoch} | extra)


def finish_run(run_dir: Path, cfg: TrainConfig, model: VisionTransformer, *, global_step: int,
               evaluation: dict[str, float], counts: dict[str, int], device: torch.device, started: dt.datetime,
               subsets: dict[str, Any], extra: dict[str, Any] | None = None, is_main: bool = True
               ) -> dict[str, Any]:
    """The run's summary (``counts``: num_classes, train_images, train_images_per_epoch, eval_images); the main
    rank writes the final model.safetensors and summary.json."""
    # the augmentation protocol is the supervised objective's; DINO brings its own multi-crop augmentation
    protocol = {"protocol": cfg.protocol} if cfg.objective == "supervised" else {}
    summary = {"run_dir": str(run_dir), "objective": cfg.objective, **protocol, "epochs": cfg.epochs,
               "steps": global_step, "eval": evaluation, **counts, **(extra or {}),
               "provenance": run_provenance(cfg, device, started, subsets)}
    if is_main:
        save_model(model, run_dir / "model.safetensors")
        write_json(run_dir / "summary.json", summary)
    return summary
