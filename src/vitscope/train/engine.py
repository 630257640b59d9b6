"""The training engine: a resumable loop that runs any ``Objective``.

Randomness is a function of (seed, epoch, step, rank): each epoch's data order comes from its own
generator, and each step's augmentation and dropout from a generator seeded for that step. A run killed
at any moment and resumed from its last checkpoint therefore continues exactly where it was.
"""

from __future__ import annotations

import datetime as dt
import sys
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from torch import nn
from tqdm.auto import tqdm

from vitscope.attention import deferred_exactness, unproven_scalars
from vitscope.data import load_dataset
from vitscope.data.choice import describe_choice, open_for_training
from vitscope.threads import CoreShare
from vitscope.train.batches import batch_source
from vitscope.train.checkpoint import save_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext
from vitscope.train.logging import MetricsLog
from vitscope.train.loop import (
    EpochHook,
    LossWindow,
    StopFlag,
    TrainingDiverged,
    TrainingInterrupted,
    apply_weight_decay,
    check_finite,
    check_splits,
    epoch_records,
    finish_run,
    flatten_scalars,
    hook_scalars,
    prepare_run,
    resolve_hook,
    train_record,
    trainer_state,
    write_run_config,
)
from vitscope.train.objective import Objective
from vitscope.train.schedules import epoch_note, epoch_order, lr_multiplier, step_seed, warmup_note
from vitscope.train.step_compile import step_runner

__all__ = ["EpochHook", "TrainingDiverged", "TrainingInterrupted", "clip_gradients", "flatten_scalars",
           "hook_scalars", "prepare_run", "resolve_hook", "run"]


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
    check_splits(train_set, eval_set, cfg)
    if ctx.is_main and cfg.progress and cfg.data_dir is not None:  # built-in scenes: nothing to choose
        print(f"vitscope: {describe_choice(data_choice)}", file=sys.stderr)
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
    # said after the first step: a run refused before it (data, resume state, a first batch) prints one line
    notes = [n for n in (warmup_note(cfg), epoch_note(len(train_set), cfg.batch_size)) if n and ctx.is_main]
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
    step_model = step_runner(ddp_model, cfg.compile, say=None if ctx.is_main else lambda line: None)
    clip_mode = cfg.grad_clip_mode or objective.grad_clip_mode
    if ctx.is_main:
        write_run_config(run_dir, cfg, ctx.device, started, subsets, ctx.world_size, steps_per_epoch,
                         data=data_choice)
    log = MetricsLog(run_dir, global_step if state is not None else None, enabled=ctx.is_main)
    local_batch = cfg.batch_size // ctx.world_size
    bar = tqdm(total=total_steps * cfg.batch_size, initial=global_step * cfg.batch_size, unit="img",
               desc=f"train {cfg.protocol if cfg.objective == 'supervised' else cfg.objective}",
               disable=not (cfg.progress and ctx.is_main), dynamic_ncols=True)
    window = LossWindow(ctx.device)
    if state is not None:
        window.load_state_dict(state.get("loss_window"), holds_sum=ctx.is_main)
    last_eval: dict[str, float] = {}

    def checkpoint() -> Path | None:
        window_state = window.state_dict(ctx.all_reduce_sum)  # every rank takes part in the reduction
        if not ctx.is_main:
            return None
        state_out = trainer_state(optimizer_state=optimizer.state_dict(), scheduler_state=scheduler.state_dict(),
                                  global_step=global_step, steps_per_epoch=steps_per_epoch, cfg=cfg,
                                  rng=torch.get_rng_state(), objective_state=objective.state_dict(),
                                  loss_window=window_state)
        return save_checkpoint(run_dir, global_step, objective.exported, state_out, keep=cfg.keep_last)

    ddp_model.train()
    with StopFlag() as stop, bar, closing(log), CoreShare(ctx.device) as cores:
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
                apply_weight_decay(optimizer, cfg, global_step, total_steps)
                with deferred_exactness(ctx.device):  # on CUDA: no host read in the sparse normalisers
                    loss = objective.loss(step_model, images, labels, batch, epoch, generator)
                    loss.backward()
                if cfg.grad_clip > 0:
                    clip_gradients(model.parameters(), cfg.grad_clip, clip_mode)
                objective.before_optimizer_step(epoch)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                objective.after_optimizer_step(global_step, total_steps)
                window.add(loss)
                global_step += 1
                for note in notes:
                    bar.write(note, file=sys.stderr)
                notes = []
                cores.tick()  # fewer intra-op threads while other processes hold cores (vitscope.threads)
                bar.update(cfg.batch_size)
                end_of_epoch = step_in_epoch == steps_per_epoch - 1
                if window.due(cfg.log_every_steps, end_of_epoch):
                    mean_loss, rate = window.take(cfg.batch_size, ctx.all_reduce_sum, ctx.world_size)
                    check_finite(mean_loss, global_step, run_dir, cfg.lr)
                    lr = scheduler.get_last_lr()[0]
                    log.write(train_record(global_step, epoch, mean_loss, lr, rate,
                                           objective.step_scalars() | unproven_scalars()))
                    bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}")
                if end_of_epoch:
                    last_eval = epoch_records(log, cfg, epoch=epoch, global_step=global_step, total_steps=total_steps,
                                              evaluate=partial(objective.evaluate, ctx, epoch),
                                              model=objective.exported, hooks=hooks, run_dir=run_dir,
                                              is_main=ctx.is_main) or last_eval
                every = cfg.checkpoint_every_steps
                if end_of_epoch or (every and global_step % every == 0) or stop.signal is not None:
                    check_finite(window.pending(), global_step, run_dir, cfg.lr)
                    checkpoint()
                    ctx.barrier()
                if stop.signal is not None:
                    raise stop.interrupted(global_step, f"continue with: vitscope train --resume {run_dir}")
    counts = {"num_classes": train_set.num_classes, "train_images": len(train_set),
              "train_images_per_epoch": steps_per_epoch * cfg.batch_size, "eval_images": len(eval_set)}
    return finish_run(run_dir, cfg, objective.exported, global_step=global_step,
                      evaluation=last_eval or objective.evaluate(ctx, cfg.epochs - 1), counts=counts,
                      device=ctx.device, started=started, subsets=subsets, extra=objective.summary(),
                      is_main=ctx.is_main)
