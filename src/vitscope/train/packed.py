"""Train K supervised runs as one packed model: ``train_packed([cfg_1, ..., cfg_K])``.

The runs may differ in ``seed``, ``protocol`` and ``out``; everything else (model, data, schedule) is shared.
Each member keeps what its solo run has: its own data order, per-image augmentation stream and step seeds
(from its seed, as the engine draws them), its protocol, its optimiser state (a slice of one optimiser over
the stacked weights), its gradient clipping, its log, evaluations, snapshots and checkpoints. Every member's
run folder is exactly a solo run's, and its weights equal the solo run's up to float rounding, so a pack can
be resumed packed or solo, and analyses read members like any run.

One step has no host synchronisation on CUDA for protocols whose augmentations have none (base crop + flip
and label smoothing): indices, augmentation, forward, loss, clipping and the optimiser stay on the device;
losses are read back only at the logging cadence.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import signal
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from vitscope.data import ImageDataset, load_dataset
from vitscope.files import write_json
from vitscope.models import VisionTransformer, load_weights, save_model
from vitscope.models.packed import PackedViT, check_packable
from vitscope.provenance import provenance, resolve_device
from vitscope.train.checkpoint import checkpoint_root, load_state, save_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext
from vitscope.train.logging import MetricsLog
from vitscope.train.loop import (
    EpochHook,
    StopFlag,
    TrainingDiverged,
    TrainingInterrupted,
    hook_scalars,
    prepare_run,
    resolve_hook,
)
from vitscope.train.objective import autocast
from vitscope.train.pack_state import (
    clip_member_gradients,
    common_checkpoint_step,
    load_member_states,
    member_state,
    packed_optimizer,
    prune_checkpoints,
    solo_optimizer,
)
from vitscope.train.protocols import Protocol, soft_cross_entropy
from vitscope.train.schedules import cosine, epoch_order, lr_multiplier, step_seed
from vitscope.train.supervised import build_model, evaluate

MEMBER_KEYS = ("seed", "protocol", "out")  # what may differ between the runs of one pack


def check_pack_configs(cfgs: Sequence[TrainConfig]) -> None:
    """A ValueError naming the first key on which two runs differ (other than seed, protocol, out)."""
    if not cfgs:
        raise ValueError("a pack needs at least one run")
    first = cfgs[0].to_dict()
    for cfg in cfgs:
        if cfg.objective != "supervised":
            raise ValueError(f"objective={cfg.objective!r}: only supervised runs pack; train it unpacked (--pack 1)")
        for key, value in cfg.to_dict().items():
            if key not in MEMBER_KEYS and value != first[key]:
                raise ValueError(f"runs of one pack must share {key} (got {first[key]!r} and {value!r}); only "
                                 f"{', '.join(MEMBER_KEYS)} may differ")
    outs = [str(Path(c.out).resolve()) for c in cfgs]
    if len(set(outs)) != len(outs):
        raise ValueError("two runs of the pack share one run folder; give each its own out")


@dataclass
class Member:
    """One run of a pack: its config, solo model (receives the weights for evaluation and saving),
    protocol, solo optimiser (its checkpoint layout) and log."""

    cfg: TrainConfig
    model: VisionTransformer
    protocol: Protocol
    optimizer: torch.optim.Optimizer
    log: MetricsLog | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out)


def pack_batches(members: Sequence[Member], images: torch.Tensor, labels: torch.Tensor,
                 orders: Sequence[torch.Tensor], step_in_epoch: int, epoch: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's batch of the step, augmented by its protocol with its step generator, stacked:
    inputs (K, B, C, H, W) and soft targets (K, B, classes). Also seeds torch's global generator as the
    engine does for a solo step (for the last member; packs have no dropout)."""
    inputs, targets = [], []
    for member, order in zip(members, orders, strict=True):
        b = member.cfg.batch_size
        batch = order[step_in_epoch * b: (step_in_epoch + 1) * b]
        seed = step_seed(member.cfg.seed, epoch, step_in_epoch, 0)
        generator = torch.Generator(device=device).manual_seed(seed)
        torch.manual_seed(seed)
        x, t = member.protocol(images[batch], labels[batch], generator)
        inputs.append(x)
        targets.append(t)
    return torch.stack(inputs), torch.stack(targets)


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each member's mean loss (K,) from logits and soft targets (K, B, classes); their sum's gradient is
    each member's own gradient."""
    return torch.stack([soft_cross_entropy(logits[k], targets[k]) for k in range(logits.shape[0])])


def pack_step(step_model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
              targets: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """One optimisation step of every member (forward under the config's autocast, backward, each member's
    clipping, the optimiser); returns the members' losses (K,), detached, on the device (no host sync)."""
    with autocast(inputs.device, cfg.amp):
        logits = step_model(inputs)
    losses = member_losses(logits, targets)
    losses.sum().backward()
    params = [group_param for group in optimizer.param_groups for group_param in group["params"]]
    if cfg.grad_clip > 0:
        clip_member_gradients(params, cfg.grad_clip, cfg.grad_clip_mode or "global")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return losses.detach()


def build_members(cfgs: Sequence[TrainConfig], train_set: ImageDataset, device: torch.device
                  ) -> tuple[list[Member], PackedViT, torch.optim.Optimizer]:
    """Each run's model (initialised under its seed, as a solo run is), protocol and solo optimiser; the
    pack of their models on ``device`` and one optimiser over it with the solo optimiser's groups."""
    members = []
    for c in cfgs:
        torch.manual_seed(c.seed)  # a solo run seeds before building its model
        model = build_model(c, train_set).to(device)
        protocol = Protocol(c.protocol, train_set.num_classes, train_set.mean, train_set.std,
                            color_jitter_instead=c.dataset == "tiny-imagenet", crop_padding=c.crop_padding,
                            smoothing=c.label_smoothing, cutmix_alpha=c.cutmix_alpha, mixup_alpha=c.mixup_alpha)
        members.append(Member(c, model, protocol, solo_optimizer(model, c, c.lr)))
    check_packable([m.model for m in members])
    packed = PackedViT([m.model for m in members]).to(device)
    return members, packed, packed_optimizer(packed, members[0].optimizer, members[0].model)


def auto_pack_size(cfg: TrainConfig, runs: int, device: torch.device, memory_fraction: float = 0.8,
                   cpu_limit: int = 8) -> int:
    """How many runs of ``cfg``'s shape to pack on ``device``: on CUDA, as many as the free memory holds at
    the peak memory of one training step of a one-member pack (x 1.25 for headroom); on CPU ``cpu_limit``.
    Never more than ``runs``, never less than 1."""
    if device.type != "cuda":
        return max(1, min(runs, cpu_limit))
    train_set = load_dataset(cfg.dataset, cfg.data_dir, "train", **cfg.dataset_options).subset(cfg.batch_size)
    model = build_model(cfg, train_set).to(device)
    packed = PackedViT([model])
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    images = torch.randn(1, cfg.batch_size, 3, train_set.image_size, train_set.image_size, device=device)
    with autocast(device, cfg.amp):
        loss = packed(images).float().logsumexp(-1).mean()
    loss.backward()
    per_member = 1.25 * (torch.cuda.max_memory_allocated(device) - base) + 4 * sum(
        p.numel() * 4 for p in packed.parameters())  # activations + weights, grads and AdamW moments
    free, _ = torch.cuda.mem_get_info(device)
    del packed, model, loss
    return max(1, min(runs, int(memory_fraction * free // per_member)))


def train_packed(cfgs: Sequence[TrainConfig], *, resume: bool = False, hooks: list[EpochHook] | None = None
                 ) -> list[dict[str, Any]]:
    """Train (or resume) the runs ``cfgs`` as one pack; returns each run's summary (also its summary.json).

    Finished runs (summary.json present on resume) are read back; the others resume together from the newest
    step all of them have a checkpoint of (or start afresh when they share none)."""
    check_pack_configs(cfgs)
    done = {i: json.loads((Path(c.out) / "summary.json").read_text()) for i, c in enumerate(cfgs)
            if resume and (Path(c.out) / "summary.json").is_file()}
    todo = [c for i, c in enumerate(cfgs) if i not in done]
    if todo:
        for i, summary in zip([i for i in range(len(cfgs)) if i not in done], _run_pack(todo, resume, hooks or []),
                              strict=True):
            done[i] = summary
    return [done[i] for i in range(len(cfgs))]


def _run_pack(cfgs: Sequence[TrainConfig], resume: bool, hooks: list[EpochHook]) -> list[dict[str, Any]]:
    started = dt.datetime.now(dt.UTC)
    cfg = cfgs[0]
    if not resume:
        for c in cfgs:
            prepare_run(c, resume=False)  # raises when a run folder already holds a run
    hooks = list(hooks) + [resolve_hook(name) for name in cfg.epoch_hooks]
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("packed training runs in one process on one device; launch it without torchrun")
    device = resolve_device(cfg.device)
    ctx = DistContext(0, 1, device, False)
    train_set: ImageDataset = load_dataset(cfg.dataset, cfg.data_dir, "train", **cfg.dataset_options
                                           ).subset(cfg.train_images)
    eval_set = load_dataset(cfg.dataset, cfg.data_dir, "eval", **cfg.dataset_options).subset(cfg.eval_images)
    if cfg.batch_size > len(train_set):
        raise ValueError(f"batch_size={cfg.batch_size} exceeds the {len(train_set)} training images; "
                         "lower --set batch_size")
    members, packed, optimizer = build_members(cfgs, train_set, device)
    steps_per_epoch = len(train_set) // cfg.batch_size
    total_steps = cfg.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg, steps_per_epoch))
    decayed = [group for group in optimizer.param_groups if group["scheduled_decay"]]
    global_step = 0
    step = common_checkpoint_step([m.run_dir for m in members]) if resume else None
    if step is not None:
        states = []
        for k, member in enumerate(members):
            folder = checkpoint_root(member.run_dir) / f"step-{step:09d}"
            states.append(load_state(folder))
            load_weights(member.model, folder / "model.safetensors")
            packed.pack_from(k, member.model)
        load_member_states(optimizer, [m.optimizer for m in members], [s["optimizer"] for s in states])
        scheduler.load_state_dict(states[0]["scheduler"])
        global_step = step
    step_model = torch.compile(packed) if cfg.compile else packed
    keep_every = cfg.keep_every if cfg.keep_every is not None else max(1, round(cfg.epochs / 10))
    for member in members:
        meta = provenance(config=member.cfg.to_dict(), seed=member.cfg.seed, dataset=cfg.dataset,
                          dataset_root=cfg.data_dir, device=device, started=started)
        write_json(member.run_dir / "config.json", meta | {"world_size": 1, "steps_per_epoch": steps_per_epoch})
    images_dev, labels_dev = train_set.images.to(device), train_set.labels.to(device)
    K, batch = len(members), cfg.batch_size
    bar = tqdm(total=total_steps * batch * K, initial=global_step * batch * K, unit="img",
               desc=f"train pack of {K}", disable=not cfg.progress, dynamic_ncols=True)
    running = torch.zeros(K, device=device)
    window_start, window_steps = time.perf_counter(), 0
    last_eval: list[dict[str, float]] = [{} for _ in members]

    def unpack_all() -> None:
        for k, member in enumerate(members):
            packed.unpack_into(k, member.model)

    def checkpoint() -> None:
        unpack_all()
        for k, member in enumerate(members):
            state = {"optimizer": member_state(optimizer, member.optimizer, k), "scheduler": scheduler.state_dict(),
                     "global_step": global_step, "epoch": global_step // steps_per_epoch,
                     "step_in_epoch": global_step % steps_per_epoch, "seed": member.cfg.seed,
                     "rng": {"torch": torch.Generator().manual_seed(
                         step_seed(member.cfg.seed, *divmod(global_step - 1, steps_per_epoch), 0)).get_state()},
                     "config": member.cfg.to_dict(), "objective": {}}
            save_checkpoint(member.run_dir, global_step, member.model, state, keep=2)
        for member in members:  # only once every member holds this step: the solo layout keeps one
            prune_checkpoints(member.run_dir, global_step)

    def check_finite(values: list[float]) -> None:
        for member, value in zip(members, values, strict=True):
            if not math.isfinite(value):
                raise TrainingDiverged(f"loss of {member.run_dir} became {value} near step {global_step}; the last "
                                       f"good checkpoints are kept; lower lr (now {cfg.lr}) or keep grad_clip > 0")

    def end_of_epoch_records(epoch: int) -> None:
        unpack_all()
        for k, member in enumerate(members):
            if (epoch + 1) % cfg.eval_every == 0 or global_step == total_steps:
                last_eval[k] = evaluate(member.model, eval_set, batch, ctx, cfg.amp)
                member.log.write({"kind": "eval", "step": global_step, "epoch": epoch + 1, **last_eval[k]})
            if hooks:
                member.log.write({"kind": "epoch", "step": global_step, "epoch": epoch + 1,
                                  **hook_scalars(hooks, member.model)})
            if (epoch + 1) % keep_every == 0 or global_step == total_steps:
                save_model(member.model, member.run_dir / "snapshots" / f"epoch-{epoch + 1:04d}.safetensors")

    packed.train()
    with StopFlag() as stop, bar, ExitStack() as logs:
        for member in members:
            member.log = MetricsLog(member.run_dir, global_step if step is not None else None)
            logs.callback(member.log.close)
        while global_step < total_steps:
            epoch, in_epoch = divmod(global_step, steps_per_epoch)
            orders = [epoch_order(len(train_set), m.cfg.seed, epoch).to(device) for m in members]
            for step_in_epoch in range(in_epoch, steps_per_epoch):
                if cfg.weight_decay_end is not None:
                    for group in decayed:
                        progress = global_step / total_steps
                        group["weight_decay"] = cosine(cfg.weight_decay, cfg.weight_decay_end, progress)
                inputs, targets = pack_batches(members, images_dev, labels_dev, orders, step_in_epoch, epoch, device)
                losses = pack_step(step_model, optimizer, inputs, targets, cfg)
                scheduler.step()
                running += losses
                global_step += 1
                window_steps += 1
                bar.update(batch * K)
                end_of_epoch = step_in_epoch == steps_per_epoch - 1
                if window_steps >= cfg.log_every_steps or end_of_epoch:
                    means = (running / window_steps).tolist()
                    check_finite(means)
                    rate = window_steps * batch / (time.perf_counter() - window_start)
                    lr = scheduler.get_last_lr()[0]
                    for member, mean_loss in zip(members, means, strict=True):
                        member.log.write({"kind": "train", "step": global_step, "epoch": epoch + 1, "loss": mean_loss,
                                          "lr": lr, "images_per_s": rate})
                    bar.set_postfix(loss=f"{sum(means) / K:.3f}", lr=f"{lr:.2e}")
                    running.zero_()
                    window_start, window_steps = time.perf_counter(), 0
                if end_of_epoch:
                    end_of_epoch_records(epoch)
                every = cfg.checkpoint_every_steps
                if end_of_epoch or (every and global_step % every == 0) or stop.signal is not None:
                    check_finite((running / max(window_steps, 1)).tolist())
                    checkpoint()
                if stop.signal is not None:
                    name = signal.Signals(stop.signal).name
                    raise TrainingInterrupted(f"stopped by {name} at step {global_step}; checkpoints written; "
                                              "continue by running the same pack again with resume")
    unpack_all()
    summaries = []
    for k, member in enumerate(members):
        c = member.cfg
        summary = {"run_dir": str(member.run_dir), "objective": c.objective, "protocol": c.protocol,
                   "epochs": c.epochs, "steps": global_step,
                   "eval": last_eval[k] or evaluate(member.model, eval_set, batch, ctx, cfg.amp),
                   "num_classes": train_set.num_classes, "train_images": len(train_set),
                   "eval_images": len(eval_set),
                   "provenance": provenance(config=c.to_dict(), seed=c.seed, dataset=c.dataset,
                                            dataset_root=c.data_dir, device=device, started=started)}
        save_model(member.model, member.run_dir / "model.safetensors")
        write_json(member.run_dir / "summary.json", summary)
        summaries.append(summary)
    return summaries
