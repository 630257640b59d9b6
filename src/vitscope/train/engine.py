"""The training engine: a resumable loop that runs any ``Objective``.

Randomness is a function of (seed, epoch, step, rank): each epoch's data order comes from its own
generator, and each step's augmentation and dropout from a generator seeded for that step. A run killed
at any moment and resumed from its last checkpoint therefore continues exactly where it was.
"""

from __future__ import annotations

import datetime as dt
import importlib
import math
import signal
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from torch import nn
from tqdm.auto import tqdm

from vitscope.data import load_dataset
from vitscope.data.choice import open_for_training
from vitscope.files import write_json
from vitscope.models import save_model
from vitscope.provenance import provenance
from vitscope.train.batches import batch_source
from vitscope.train.checkpoint import latest_checkpoint, load_state, save_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext
from vitscope.train.logging import MetricsLog
from vitscope.train.objective import Objective
from vitscope.train.schedules import cosine, epoch_order, lr_multiplier, step_seed

EpochHook = Callable[[nn.Module], dict[str, Any]]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM arrived; a checkpoint was written first."""


class _StopFlag:
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


def prepare_run(cfg: TrainConfig, resume: bool) -> tuple[Path, dict[str, Any] | None]:
    run_dir = Path(cfg.out)
    checkpoint = latest_checkpoint(run_dir)
    if not resume and (checkpoint is not None or (run_dir / "summary.json").exists()):
        raise ValueError(f"run folder {run_dir} already holds a run; continue it with --resume {run_dir} "
                         "or choose another --out")
    return run_dir, (load_state(checkpoint) | {"path": str(checkpoint)}) if resume and checkpoint else None


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


def clip_gradients(parameters, max_norm: float, mode: str) -> None:
    """``global``: one norm over all gradients (torch's clip_grad_norm_); ``per_tensor``: each gradient
    scaled by max_norm / (norm + 1e-6) when that is below 1 (DINO's ``clip_gradients``)."""
    parameters = [p for p in parameters if p.grad is not None]
    if mode == "global":
        nn.utils.clip_grad_norm_(parameters, max_norm)
        return
    for p in parameters:
        factor = max_norm / (p.grad.detach().norm(2) + 1e-6)
        p.grad.mul_(torch.clamp(factor, max=1.0))


def run(cfg: TrainConfig, objective: Objective, ctx: DistContext, *, resume: bool = False,
        hooks: list[EpochHook] | None = None) -> dict[str, Any]:
    """Train (or resume) ``objective`` as ``cfg`` says; returns the summary also written to summary.json."""
    started = dt.datetime.now(dt.UTC)
    run_dir, state = prepare_run(cfg, resume)
    hooks = list(hooks or []) + [resolve_hook(name) for name in cfg.epoch_hooks]
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(cfg.seed)
    if cfg.download and ctx.is_main:  # one rank fetches; the others wait for it
        load_dataset(cfg.dataset, cfg.data_dir, "train", download=True)
    ctx.barrier()
    data_choice = {}
    for split in ("train", "eval"):
        data_choice[split] = open_for_training(cfg.dataset, cfg.data_dir, split, stream=cfg.stream,
                                               memory_budget_gb=cfg.memory_budget_gb, **cfg.dataset_options)
    train_set = data_choice["train"][0].subset(cfg.train_images)
    eval_set = data_choice["eval"][0].subset(cfg.eval_images)
    data_choice = {split: decision for split, (_, decision) in data_choice.items()}
    if ctx.is_main and cfg.progress:
        print("vitscope: data " + "; ".join(f"{split} {'streamed' if d['stream'] else 'in memory'} ({d['reason']})"
                                            for split, d in data_choice.items()), file=sys.stderr)
    if cfg.batch_size % ctx.world_size or cfg.batch_size > len(train_set):
        raise ValueError(f"batch_size={cfg.batch_size} must divide by {ctx.world_size} ranks and not exceed the "
                         f"{len(train_set)} training images; lower --set batch_size")
    subsets = {"train": train_set.selection, "eval": eval_set.selection}
    objective.setup(train_set, eval_set, ctx)
    batches = batch_source(train_set, objective, cfg, ctx)
    model = objective.trainable
    base_lr = cfg.lr * objective.lr_scale()
    optimizer = create_optimizer_v2(model, opt="adamw", lr=base_lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(train_set) // cfg.batch_size
    total_steps = cfg.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg, steps_per_epoch))
    for group in optimizer.param_groups:  # kept in the optimizer's state, so it survives load_state_dict
        group["scheduled_decay"] = group["weight_decay"] > 0
    global_step = 0
    if state is not None:
        objective.restore(Path(state["path"]), state.get("objective", {}))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        global_step = state["global_step"]
        torch.set_rng_state(state["rng"]["torch"])
    ddp_model = model
    if ctx.enabled:
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    step_model = torch.compile(ddp_model) if cfg.compile else ddp_model
    clip_mode = cfg.grad_clip_mode or objective.grad_clip_mode
    keep_every = cfg.keep_every if cfg.keep_every is not None else max(1, round(cfg.epochs / 10))
    if ctx.is_main:
        meta = provenance(config=cfg.to_dict(), seed=cfg.seed, dataset=cfg.dataset, dataset_root=cfg.data_dir,
                          device=ctx.device, started=started, subsets=subsets)
        write_json(run_dir / "config.json", meta | {"world_size": ctx.world_size, "steps_per_epoch": steps_per_epoch,
                                                    "data": data_choice})
    log = MetricsLog(run_dir, global_step if state is not None else None, enabled=ctx.is_main)
    local_batch = cfg.batch_size // ctx.world_size
    bar = tqdm(total=total_steps * cfg.batch_size, initial=global_step * cfg.batch_size, unit="img",
               desc=f"train {cfg.protocol if cfg.objective == 'supervised' else cfg.objective}",
               disable=not (cfg.progress and ctx.is_main), dynamic_ncols=True)
    running = torch.zeros((), device=ctx.device)
    window_start, window_steps = time.perf_counter(), 0
    last_eval: dict[str, float] = {}

    def checkpoint() -> Path | None:
        if not ctx.is_main:
            return None
        state_out = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "global_step": global_step, "epoch": global_step // steps_per_epoch,
                     "step_in_epoch": global_step % steps_per_epoch, "seed": cfg.seed,
                     "rng": {"torch": torch.get_rng_state()}, "config": cfg.to_dict(),
                     "objective": objective.state_dict()}
        return save_checkpoint(run_dir, global_step, objective.exported, state_out)

    def check_finite(value: float) -> None:
        if not math.isfinite(value):
            kept = latest_checkpoint(run_dir)
            raise TrainingDiverged(f"loss became {value} near step {global_step}; the last good checkpoint "
                                   f"{kept or '(none yet)'} is kept; lower lr (now {cfg.lr}) or keep grad_clip > 0")

    def end_of_epoch_records(epoch: int) -> None:
        nonlocal last_eval
        if (epoch + 1) % cfg.eval_every == 0 or global_step == total_steps:
            result = objective.evaluate(ctx, epoch)  # an objective may skip epochs (DINO's knn_every)
            if result:
                last_eval = result
                log.write({"kind": "eval", "step": global_step, "epoch": epoch + 1, **last_eval})
        if hooks and ctx.is_main:
            log.write({"kind": "epoch", "step": global_step, "epoch": epoch + 1,
                       **hook_scalars(hooks, objective.exported)})
        if ctx.is_main and ((epoch + 1) % keep_every == 0 or global_step == total_steps):
            save_model(objective.exported, run_dir / "snapshots" / f"epoch-{epoch + 1:04d}.safetensors")

    ddp_model.train()
    with _StopFlag() as stop, bar, closing(log):
        while global_step < total_steps:
            epoch, in_epoch = divmod(global_step, steps_per_epoch)
            order = epoch_order(len(train_set), cfg.seed, epoch).to(batches.index_device)
            steps = range(in_epoch, steps_per_epoch)
            rank_part = slice(ctx.rank * local_batch, (ctx.rank + 1) * local_batch)
            local = [order[s * cfg.batch_size : (s + 1) * cfg.batch_size][rank_part] for s in steps]
            for step_in_epoch, batch, (images, labels) in zip(steps, local, batches.fetch(epoch, local), strict=True):
                seed = step_seed(cfg.seed, epoch, step_in_epoch, ctx.rank)
                generator = torch.Generator(device=ctx.device).manual_seed(seed)
                torch.manual_seed(seed)
                if cfg.weight_decay_end is not None:
                    for group in (g for g in optimizer.param_groups if g["scheduled_decay"]):
                        progress = global_step / total_steps
                        group["weight_decay"] = cosine(cfg.weight_decay, cfg.weight_decay_end, progress)
                loss = objective.loss(step_model, images, labels, batch, epoch, generator)
                loss.backward()
                if cfg.grad_clip > 0:
                    clip_gradients(model.parameters(), cfg.grad_clip, clip_mode)
                objective.before_optimizer_step(epoch)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                objective.after_optimizer_step(global_step, total_steps)
                running += loss.detach()
                global_step += 1
                window_steps += 1
                bar.update(cfg.batch_size)
                end_of_epoch = step_in_epoch == steps_per_epoch - 1
                if window_steps >= cfg.log_every_steps or end_of_epoch:
                    mean_loss = float(ctx.all_reduce_sum(running.clone())) / (window_steps * ctx.world_size)
                    check_finite(mean_loss)
                    rate = window_steps * cfg.batch_size / (time.perf_counter() - window_start)
                    log.write({"kind": "train", "step": global_step, "epoch": epoch + 1, "loss": mean_loss,
                               "lr": scheduler.get_last_lr()[0], "images_per_s": rate, **objective.step_scalars()})
                    bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                    running.zero_()
                    window_start, window_steps = time.perf_counter(), 0
                if end_of_epoch:
                    end_of_epoch_records(epoch)
                every = cfg.checkpoint_every_steps
                if end_of_epoch or (every and global_step % every == 0) or stop.signal is not None:
                    check_finite(float(running) if window_steps else 0.0)
                    checkpoint()
                    ctx.barrier()
                if stop.signal is not None:
                    name = signal.Signals(stop.signal).name
                    raise TrainingInterrupted(f"stopped by {name} at step {global_step}; checkpoint written; "
                                              f"continue with: vitscope train --resume {run_dir}")
    summary = {"run_dir": str(run_dir), "objective": cfg.objective, "protocol": cfg.protocol, "epochs": cfg.epochs,
               "steps": global_step, "eval": last_eval or objective.evaluate(ctx, cfg.epochs - 1),
               "num_classes": train_set.num_classes, "train_images": len(train_set), "eval_images": len(eval_set),
               **objective.summary(),
               "provenance": provenance(config=cfg.to_dict(), seed=cfg.seed, dataset=cfg.dataset,
                                        dataset_root=cfg.data_dir, device=ctx.device, started=started,
                                        subsets=subsets)}
    if ctx.is_main:
        save_model(objective.exported, run_dir / "model.safetensors")
        write_json(run_dir / "summary.json", summary)
    return summary
