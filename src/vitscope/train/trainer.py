"""Supervised training: AdamW with warmup and cosine decay, batched augmentation, safe checkpoints.

Randomness is a function of (seed, epoch, step, rank): each epoch's data order comes from its own
generator, and each step's augmentation and dropout from a generator seeded for that step. A run killed
at any moment and resumed from its last checkpoint therefore continues exactly where it was.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import signal
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from torch import nn
from tqdm.auto import tqdm

from vitscope.data import ImageDataset, eval_batches, load_dataset
from vitscope.files import write_json
from vitscope.models import VisionTransformer, load_weights, save_model
from vitscope.models import load as load_model
from vitscope.provenance import provenance
from vitscope.train.checkpoint import latest_checkpoint, load_state, save_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext, setup_distributed
from vitscope.train.logging import MetricsLog
from vitscope.train.protocols import Protocol, soft_cross_entropy


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM arrived; a checkpoint was written first."""


def lr_multiplier(step: int, cfg: TrainConfig, steps_per_epoch: int) -> float:
    """Linear warmup over ``warmup_epochs``, then cosine decay from ``lr`` to ``min_lr``."""
    warm = int(cfg.warmup_epochs * steps_per_epoch)
    total = cfg.epochs * steps_per_epoch
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def step_seed(seed: int, epoch: int, step: int, rank: int = 0) -> int:
    return (seed * 1_000_003 + epoch * 10_007 + step * 101 + rank) % (2**63 - 1)


def epoch_order(num_items: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(num_items, generator=torch.Generator().manual_seed(step_seed(seed, epoch, -1)))


def autocast(device: torch.device, amp: str):
    enabled = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


@torch.no_grad()
def evaluate(model: nn.Module, dataset: ImageDataset, batch_size: int, ctx: DistContext, amp: str = "auto"
             ) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy on ``dataset``, each rank taking its share, reduced."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # correct, loss sum, count
    for images, labels in eval_batches(dataset, batch_size, ctx.device, rank=ctx.rank, world_size=ctx.world_size):
        with autocast(ctx.device, amp):
            logits = model(images).float()
        totals[0] += (logits.argmax(-1) == labels).sum()
        totals[1] += nn.functional.cross_entropy(logits, labels, reduction="sum")
        totals[2] += len(labels)
    ctx.all_reduce_sum(totals)
    model.train(was_training)
    count = max(float(totals[2]), 1.0)
    return {"top1": float(totals[0]) / count, "loss": float(totals[1]) / count}


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


def build_model(cfg: TrainConfig, train_set: ImageDataset) -> nn.Module:
    options = {"num_classes": train_set.num_classes, "img_size": train_set.image_size, **cfg.model_options}
    model = load_model(cfg.model, **options)
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"training builds vitscope models; {cfg.model} is not one (use a preset such as vit-compact)")
    return model


def train(cfg: TrainConfig, *, resume: bool = False) -> dict[str, Any]:
    """Train (or resume) the run described by ``cfg``; returns the summary also written to summary.json."""
    run_dir = Path(cfg.out)
    if resume and (run_dir / "summary.json").exists():
        return json.loads((run_dir / "summary.json").read_text())
    ctx = setup_distributed(cfg.device)
    try:
        return _train(cfg, ctx, resume)
    finally:
        ctx.close()


def _train(cfg: TrainConfig, ctx: DistContext, resume: bool) -> dict[str, Any]:
    started = dt.datetime.now(dt.UTC)
    run_dir, state = prepare_run(cfg, resume)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(cfg.seed)
    if cfg.download and ctx.is_main:  # one rank fetches; the others wait for it
        load_dataset(cfg.dataset, cfg.data_dir, "train", download=True)
    ctx.barrier()
    train_set = load_dataset(cfg.dataset, cfg.data_dir, "train", **cfg.dataset_options).subset(cfg.train_images)
    eval_set = load_dataset(cfg.dataset, cfg.data_dir, "eval", **cfg.dataset_options).subset(cfg.eval_images)
    if cfg.batch_size % ctx.world_size or cfg.batch_size > len(train_set):
        raise ValueError(f"batch_size={cfg.batch_size} must divide by {ctx.world_size} ranks and not exceed the "
                         f"{len(train_set)} training images; lower --set batch_size")
    model = build_model(cfg, train_set).to(ctx.device)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(train_set) // cfg.batch_size
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg, steps_per_epoch))
    global_step = 0
    if state is not None:
        load_weights(model, Path(state["path"]) / "model.safetensors")
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        global_step = state["global_step"]
        torch.set_rng_state(state["rng"]["torch"])
    ddp_model = model
    if ctx.enabled:
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    step_model = torch.compile(ddp_model) if cfg.compile else ddp_model
    protocol = Protocol(cfg.protocol, train_set.num_classes, train_set.mean, train_set.std,
                        color_jitter_instead=cfg.dataset == "tiny-imagenet", crop_padding=cfg.crop_padding,
                        smoothing=cfg.label_smoothing, cutmix_alpha=cfg.cutmix_alpha, mixup_alpha=cfg.mixup_alpha)
    if ctx.is_main:
        meta = provenance(config=cfg.to_dict(), seed=cfg.seed, dataset=cfg.dataset, dataset_root=cfg.data_dir,
                          device=ctx.device, started=started,
                          subsets={"train": train_set.selection, "eval": eval_set.selection})
        write_json(run_dir / "config.json", meta | {"world_size": ctx.world_size, "steps_per_epoch": steps_per_epoch})
    log = MetricsLog(run_dir, global_step if state is not None else None, enabled=ctx.is_main)
    images_dev, labels_dev = train_set.images.to(ctx.device), train_set.labels.to(ctx.device)
    total_steps = cfg.epochs * steps_per_epoch
    local_batch = cfg.batch_size // ctx.world_size
    bar = tqdm(total=total_steps * cfg.batch_size, initial=global_step * cfg.batch_size, unit="img",
               desc=f"train {cfg.protocol}", disable=not (cfg.progress and ctx.is_main), dynamic_ncols=True)
    running = torch.zeros((), device=ctx.device)
    window_start, window_steps = time.perf_counter(), 0
    last_eval: dict[str, float] = {}

    def checkpoint() -> Path | None:
        if not ctx.is_main:
            return None
        state_out = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "global_step": global_step, "epoch": global_step // steps_per_epoch,
                     "step_in_epoch": global_step % steps_per_epoch, "seed": cfg.seed,
                     "rng": {"torch": torch.get_rng_state()}, "config": cfg.to_dict()}
        return save_checkpoint(run_dir, global_step, model, state_out)

    def check_finite(value: float) -> None:
        if not math.isfinite(value):
            kept = latest_checkpoint(run_dir)
            raise TrainingDiverged(f"loss became {value} near step {global_step}; the last good checkpoint "
                                   f"{kept or '(none yet)'} is kept; lower lr (now {cfg.lr}) or keep grad_clip > 0")

    ddp_model.train()
    with _StopFlag() as stop, bar, closing(log):
        while global_step < total_steps:
            epoch, in_epoch = divmod(global_step, steps_per_epoch)
            order = epoch_order(len(train_set), cfg.seed, epoch).to(ctx.device)
            for step_in_epoch in range(in_epoch, steps_per_epoch):
                batch = order[step_in_epoch * cfg.batch_size : (step_in_epoch + 1) * cfg.batch_size]
                batch = batch[ctx.rank * local_batch : (ctx.rank + 1) * local_batch]
                seed = step_seed(cfg.seed, epoch, step_in_epoch, ctx.rank)
                generator = torch.Generator(device=ctx.device).manual_seed(seed)
                torch.manual_seed(seed)
                inputs, targets = protocol(images_dev[batch], labels_dev[batch], generator)
                with autocast(ctx.device, cfg.amp):
                    loss = soft_cross_entropy(step_model(inputs), targets)
                loss.backward()
                if cfg.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
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
                               "lr": scheduler.get_last_lr()[0], "images_per_s": rate})
                    bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                    running.zero_()
                    window_start, window_steps = time.perf_counter(), 0
                if end_of_epoch and ((epoch + 1) % cfg.eval_every == 0 or global_step == total_steps):
                    last_eval = evaluate(model, eval_set, cfg.batch_size, ctx, cfg.amp)
                    log.write({"kind": "eval", "step": global_step, "epoch": epoch + 1, **last_eval})
                every = cfg.checkpoint_every_steps
                if end_of_epoch or (every and global_step % every == 0) or stop.signal is not None:
                    check_finite(float(running) if window_steps else 0.0)
                    checkpoint()
                    ctx.barrier()
                if stop.signal is not None:
                    name = signal.Signals(stop.signal).name
                    raise TrainingInterrupted(f"stopped by {name} at step {global_step}; checkpoint written; "
                                              f"continue with: vitscope train --resume {run_dir}")
    summary = {"run_dir": str(run_dir), "protocol": cfg.protocol, "epochs": cfg.epochs, "steps": global_step,
               "eval": last_eval or evaluate(model, eval_set, cfg.batch_size, ctx, cfg.amp),
               "num_classes": train_set.num_classes, "train_images": len(train_set), "eval_images": len(eval_set),
               "provenance": provenance(config=cfg.to_dict(), seed=cfg.seed, dataset=cfg.dataset,
                                        dataset_root=cfg.data_dir, device=ctx.device, started=started,
                                        subsets={"train": train_set.selection, "eval": eval_set.selection})}
    if ctx.is_main:
        save_model(model, run_dir / "model.safetensors")
        write_json(run_dir / "summary.json", summary)
    return summary
