"""Train K supervised runs as one packed model: ``train_packed([cfg_1, ..., cfg_K])``.

The runs share the architecture and the data; their schedules, protocols and seeds may differ
(``MEMBER_KEYS``). Each member keeps what its solo run has: its own schedule position (step, epoch, lr and
weight decay), data order, per-image augmentation stream and step seeds, protocol, optimiser state (a slice
of one ``PackedAdamW``), gradient clipping, log, evaluations, snapshots and checkpoints. Members may start
at different steps (on resume each continues from its own latest checkpoint, packed or solo); a member that
finishes leaves the pack with its run folder finalised as a solo run's, and the others go on as a smaller
pack. Every member's run folder is exactly a solo run's and its weights equal the solo run's up to float
rounding. The loop is built from the engine's pieces (``vitscope.train.loop``).

On CUDA a step makes no host synchronisation: indices, augmentation, forward, loss, clipping and the
optimiser (lr and weight decay read from device tables filled ahead, ``TABLE_STEPS`` steps at a time)
stay on the device; a member's losses are read back at its log cadence only.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from vitscope.attention import deferred_exactness, unproven_scalars
from vitscope.data import ImageDataset, load_dataset
from vitscope.data.choice import open_for_training
from vitscope.models import VisionTransformer, load_weights
from vitscope.models.own.packed import PackedViT, check_packable
from vitscope.provenance import resolve_device
from vitscope.run_folder import writer_lock
from vitscope.threads import CoreShare
from vitscope.train.checkpoint import save_checkpoint, usable_checkpoint
from vitscope.train.config import TrainConfig
from vitscope.train.distributed import DistContext
from vitscope.train.logging import MetricsLog
from vitscope.train.loop import (
    EpochHook,
    LossWindow,
    StopFlag,
    apply_weight_decay,
    check_finite,
    check_splits,
    epoch_records,
    finish_run,
    prepare_run,
    resolve_hook,
    train_record,
    trainer_state,
    write_run_config,
)
from vitscope.train.objective import autocast
from vitscope.train.packed.adamw import PackedAdamW
from vitscope.train.packed.state import schedule_tables, solo_optimizer, to_device
from vitscope.train.protocols import Protocol, soft_cross_entropy
from vitscope.train.schedules import epoch_note, epoch_order, images_per_epoch, step_seed, warmup_note
from vitscope.train.step_compile import step_runner
from vitscope.train.supervised import build_model, evaluate

# what may differ between the runs of one pack: everything else (model, data, batch, device) is shared
MEMBER_KEYS = ("seed", "protocol", "out", "epochs", "warmup_epochs", "lr", "min_lr", "weight_decay",
               "weight_decay_end", "grad_clip", "label_smoothing", "cutmix_alpha", "mixup_alpha", "crop_padding",
               "eval_every", "checkpoint_every_steps", "log_every_steps", "keep_every", "epoch_hooks")
TABLE_STEPS = 512  # steps of lr / weight-decay values sent to the device at a time


def check_pack_configs(cfgs: Sequence[TrainConfig]) -> None:
    """A ValueError naming the first key on which two runs differ that a pack must share."""
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
    """One run of a pack at its own position: config, solo model (receives the weights for evaluation and
    saving), protocol, solo optimiser and schedule (host-side; their state is the checkpoint's), log."""

    cfg: TrainConfig
    model: VisionTransformer
    protocol: Protocol
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    steps_per_epoch: int
    global_step: int = 0
    resumed: bool = False
    hooks: list[EpochHook] = field(default_factory=list)
    log: MetricsLog | None = None
    window: LossWindow | None = None
    window_state: dict[str, Any] | None = None  # the open loss window of the checkpoint resumed from
    last_eval: dict[str, float] = field(default_factory=dict)
    checkpointed: int = -1
    _order: tuple[int, torch.Tensor] | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out)

    @property
    def total_steps(self) -> int:
        return self.cfg.epochs * self.steps_per_epoch

    @property
    def finished(self) -> bool:
        return self.global_step >= self.total_steps

    def batch(self, num_images: int, device: torch.device) -> tuple[torch.Tensor, torch.Generator]:
        """This step's image indices (on the device) and augmentation generator, as the engine draws them for
        the member's solo run; also seeds torch's global generator as the engine does."""
        epoch, step_in_epoch = divmod(self.global_step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(num_images, self.cfg.seed, epoch).to(device, non_blocking=True))
        b = self.cfg.batch_size
        seed = step_seed(self.cfg.seed, epoch, step_in_epoch, 0)
        torch.manual_seed(seed)
        generator = torch.Generator(device=device).manual_seed(seed)
        return self._order[1][step_in_epoch * b: (step_in_epoch + 1) * b], generator

    def rng_state(self) -> torch.Tensor:
        """The global generator's state a solo run checkpoints after this step (seeded by the step's seed)."""
        epoch, step = divmod(self.global_step - 1, self.steps_per_epoch)
        return torch.Generator().manual_seed(step_seed(self.cfg.seed, epoch, step, 0)).get_state()


def build_member(cfg: TrainConfig, train_set: ImageDataset, device: torch.device, resume: bool,
                 hooks: list[EpochHook]) -> Member:
    """A run's model (initialised under its seed, as a solo run is), protocol, solo optimiser and schedule;
    with ``resume``, restored from its latest checkpoint when it has one."""
    torch.manual_seed(cfg.seed)  # a solo run seeds before building its model
    model = build_model(cfg, train_set).to(device)
    protocol = Protocol(cfg.protocol, train_set.num_classes, train_set.mean, train_set.std,
                        color_jitter_instead=cfg.dataset == "tiny-imagenet", crop_padding=cfg.crop_padding,
                        smoothing=cfg.label_smoothing, cutmix_alpha=cfg.cutmix_alpha, mixup_alpha=cfg.mixup_alpha)
    steps_per_epoch = len(train_set) // cfg.batch_size
    optimizer, scheduler = solo_optimizer(model, cfg, steps_per_epoch)
    member = Member(cfg, model, protocol, optimizer, scheduler, steps_per_epoch,
                    hooks=list(hooks) + [resolve_hook(name) for name in cfg.epoch_hooks])
    found = usable_checkpoint(cfg.out) if resume else None  # verified, falling back past a damaged one
    if found is not None:
        checkpoint, state = found
        load_weights(model, checkpoint / "model.safetensors")
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        member.global_step, member.resumed, member.checkpointed = state["global_step"], True, state["global_step"]
        member.window_state = state.get("loss_window")
    return member


class Pack:
    """The unfinished members as one ``PackedViT`` with one ``PackedAdamW``. ``step()`` trains every member
    one step at its own position and advances it (step count and host-side schedule); ``unpack(k)`` copies
    member k's weights into its solo model, ``write_back()`` its weights and optimiser state."""

    def __init__(self, members: Sequence[Member], images: torch.Tensor, labels: torch.Tensor,
                 compile_model: bool = False, amp: str = "auto", say: Callable[[str], None] | None = None):
        self.members, self.images, self.labels, self.amp = list(members), images, labels, amp
        self.device = images.device
        self.model = PackedViT([m.model for m in members]).to(self.device)
        self.step_model = step_runner(self.model, compile_model, say=say)
        self.optimizer = PackedAdamW.from_solo(self.model, [m.optimizer for m in members], [m.model for m in members])
        clips = [m.cfg.grad_clip if m.cfg.grad_clip > 0 else float("inf") for m in members]
        self.clip = any(m.cfg.grad_clip > 0 for m in members)
        self.clip_modes = {m.cfg.grad_clip_mode or "global" for m in members}
        if len(self.clip_modes) > 1:
            raise ValueError(f"pack members clip gradients differently ({sorted(self.clip_modes)}); pack runs with "
                             "one grad_clip_mode")
        self.max_norms = torch.tensor(clips, device=self.device)
        self._lr = self._wd = torch.zeros(0)
        self._row = 0

    def _schedule(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's (groups, K) learning rates and weight decays, refilling the device tables when spent."""
        if self._row >= len(self._lr):
            ms = self.members
            lr, wd = schedule_tables([m.optimizer for m in ms], [m.cfg for m in ms], [m.global_step for m in ms],
                                     TABLE_STEPS, ms[0].steps_per_epoch)
            self._lr, self._wd, self._row = to_device(lr, self.device), to_device(wd, self.device), 0
        self._row += 1
        return self._lr[self._row - 1], self._wd[self._row - 1]

    def batches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each member's batch of its step, augmented by its protocol with its step generator, stacked:
        inputs (K, B, C, H, W) and soft targets (K, B, classes)."""
        inputs, targets = [], []
        for member in self.members:
            indices, generator = member.batch(len(self.images), self.device)
            x, t = member.protocol(self.images[indices], self.labels[indices], generator)
            inputs.append(x)
            targets.append(t)
        return torch.stack(inputs), torch.stack(targets)

    def step(self) -> torch.Tensor:
        """One optimisation step of every member; returns the members' losses (K,), detached, on the device."""
        inputs, targets = self.batches()
        lr, wd = self._schedule()
        with deferred_exactness(self.device):  # on CUDA: no host read in the sparse normalisers
            with autocast(self.device, self.amp):
                logits = self.step_model(inputs)
            losses = torch.stack([soft_cross_entropy(logits[k], targets[k]) for k in range(len(self.members))])
            losses.sum().backward()  # the sum's gradient is each member's own gradient
        self.optimizer.step(lr, wd, self.max_norms if self.clip else None, next(iter(self.clip_modes)))
        self.optimizer.zero_grad()
        for member in self.members:  # the solo schedule's host state, as the engine steps it
            apply_weight_decay(member.optimizer, member.cfg, member.global_step, member.total_steps)
            member.scheduler.step()
            member.global_step += 1
        return losses.detach()

    def unpack(self, k: int) -> VisionTransformer:
        return self.model.unpack_into(k, self.members[k].model)

    def optimizer_state(self, k: int) -> dict:
        """Member k's optimiser ``state_dict`` in its solo layout."""
        return self.optimizer.write_member(k, self.members[k].optimizer)

    def write_back(self) -> None:
        for k in range(len(self.members)):
            self.unpack(k)
            self.optimizer_state(k)


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

    Finished runs (summary.json present on resume) are read back; each other run continues from its own
    latest checkpoint (or starts afresh without one), whatever step the others are at."""
    check_pack_configs(cfgs)
    done = {i: json.loads((Path(c.out) / "summary.json").read_text()) for i, c in enumerate(cfgs)
            if resume and (Path(c.out) / "summary.json").is_file()}
    todo = [i for i in range(len(cfgs)) if i not in done]
    if todo:
        with ExitStack() as locks:  # one writer per run folder
            for i in todo:
                locks.enter_context(writer_lock(cfgs[i].out))
            done |= dict(zip(todo, _run_pack([cfgs[i] for i in todo], resume, hooks or []), strict=True))
    return [done[i] for i in range(len(cfgs))]


def _run_pack(cfgs: Sequence[TrainConfig], resume: bool, hooks: list[EpochHook]) -> list[dict[str, Any]]:
    started = dt.datetime.now(dt.UTC)
    cfg = cfgs[0]
    if not resume:
        for c in cfgs:
            prepare_run(c, resume=False)  # raises when a run folder already holds a run
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("packed training runs in one process on one device; launch it without torchrun")
    device = resolve_device(cfg.device)
    ctx = DistContext(0, 1, device, False)
    opened = {split: open_for_training(cfg.dataset, cfg.data_dir, split, stream=cfg.stream,
                                       memory_budget_gb=cfg.memory_budget_gb, **cfg.dataset_options)
              for split in ("train", "eval")}
    data_choice = {split: decision for split, (_, decision) in opened.items()}
    if any(d["stream"] for d in data_choice.values()):
        raise ValueError(f"packed training keeps its data in memory, but {cfg.dataset} from {cfg.data_dir} would be "
                         "streamed; set stream: false (with a larger memory_budget_gb) or train these runs unpacked")
    train_set: ImageDataset = opened["train"][0].subset(cfg.train_images)
    eval_set = opened["eval"][0].subset(cfg.eval_images)
    check_splits(train_set, eval_set, cfg)
    if cfg.batch_size > len(train_set):
        raise ValueError(f"batch_size={cfg.batch_size} exceeds the {len(train_set)} training images; "
                         "lower --set batch_size")
    subsets = {"train": train_set.selection, "eval": eval_set.selection}
    counts = {"num_classes": train_set.num_classes, "train_images": len(train_set),
              "train_images_per_epoch": images_per_epoch(len(train_set), cfg.batch_size), "eval_images": len(eval_set)}
    members = [build_member(c, train_set, device, resume, hooks) for c in cfgs]
    check_packable([m.model for m in members])
    notes = [warmup_note(c) for c in cfgs] + [epoch_note(len(train_set), cfg.batch_size)]
    for note in dict.fromkeys(note for note in notes if note):  # each said once for the pack
        print(note, file=sys.stderr)
    batch = cfg.batch_size
    for m in members:
        write_run_config(m.run_dir, m.cfg, device, started, subsets, 1, m.steps_per_epoch, data=data_choice)
    images_dev, labels_dev = train_set.images.to(device), train_set.labels.to(device)
    bar = tqdm(total=sum(m.total_steps for m in members) * batch, initial=sum(m.global_step for m in members) * batch,
               unit="img", desc=f"train pack of {len(members)}", disable=not cfg.progress, dynamic_ncols=True)

    def checkpoint(pack: Pack, k: int) -> None:
        member = pack.members[k]
        check_finite(member.window.pending(), member.global_step, member.run_dir, member.cfg.lr)
        state = trainer_state(optimizer_state=pack.optimizer_state(k), scheduler_state=member.scheduler.state_dict(),
                              global_step=member.global_step, steps_per_epoch=member.steps_per_epoch, cfg=member.cfg,
                              rng=member.rng_state(), objective_state={}, loss_window=member.window.state_dict())
        save_checkpoint(member.run_dir, member.global_step, pack.unpack(k), state, keep=member.cfg.keep_last)
        member.checkpointed = member.global_step

    def after_step(pack: Pack, k: int, loss: torch.Tensor, stop: StopFlag) -> None:
        """Member k's log line, end-of-epoch records and checkpoint, as the engine does after a step."""
        m = pack.members[k]
        m.window.add(loss)
        epoch = (m.global_step - 1) // m.steps_per_epoch
        end_of_epoch = m.global_step % m.steps_per_epoch == 0
        if m.window.due(m.cfg.log_every_steps, end_of_epoch):
            mean_loss, rate = m.window.take(batch)
            check_finite(mean_loss, m.global_step, m.run_dir, m.cfg.lr)
            m.log.write(train_record(m.global_step, epoch, mean_loss, m.scheduler.get_last_lr()[0], rate,
                                     unproven_scalars()))  # the pack's count since the last log line
        if end_of_epoch:
            pack.unpack(k)
            m.last_eval = epoch_records(m.log, m.cfg, epoch=epoch, global_step=m.global_step,
                                        total_steps=m.total_steps, evaluate=partial(
                                            evaluate, m.model, eval_set, batch, ctx, cfg.amp),
                                        model=m.model, hooks=m.hooks, run_dir=m.run_dir) or m.last_eval
        every = m.cfg.checkpoint_every_steps
        if end_of_epoch or (every and m.global_step % every == 0) or stop.signal is not None:
            checkpoint(pack, k)

    said: list[str] = []

    def say_once(line: str) -> None:  # each line once per run of packs, not once per pack
        if line not in said:
            print(line, file=sys.stderr, flush=True)
        said.append(line)

    summaries: dict[int, dict[str, Any]] = {}
    with StopFlag() as stop, bar, ExitStack() as logs, CoreShare(device) as cores:
        for m in members:
            m.log = MetricsLog(m.run_dir, m.global_step if m.resumed else None)
            logs.callback(m.log.close)
            m.window = LossWindow(device)
            m.window.load_state_dict(m.window_state)
        active = [m for m in members if not m.finished]
        while active:
            pack = Pack(active, images_dev, labels_dev, cfg.compile, cfg.amp, say=say_once)
            pack.model.train()
            for _ in range(min(m.total_steps - m.global_step for m in active)):
                losses = pack.step()
                cores.tick()  # fewer intra-op threads while other processes hold cores (vitscope.threads)
                bar.update(batch * len(active))
                for k in range(len(active)):
                    after_step(pack, k, losses[k], stop)
                if stop.signal is not None:
                    for k, m in enumerate(active):
                        if m.checkpointed != m.global_step:
                            checkpoint(pack, k)
                    raise stop.interrupted(max(m.global_step for m in active),
                                           "continue by running the same pack again with resume")
            pack.write_back()
            for m in (m for m in active if m.finished):  # leaves the pack, its run folder finalised as solo
                evaluation = m.last_eval or evaluate(m.model, eval_set, batch, ctx, cfg.amp)
                summaries[members.index(m)] = finish_run(m.run_dir, m.cfg, m.model, global_step=m.global_step,
                                                         evaluation=evaluation, counts=counts, device=device,
                                                         started=started, subsets=subsets)
            active = [m for m in active if not m.finished]
    for k, m in enumerate(members):
        if k not in summaries:  # finished before this call (resumed at its last step)
            summaries[k] = finish_run(m.run_dir, m.cfg, m.model, global_step=m.global_step,
                                      evaluation=evaluate(m.model, eval_set, batch, ctx, cfg.amp), counts=counts,
                                      device=device, started=started, subsets=subsets)
    return [summaries[k] for k in range(len(members))]
