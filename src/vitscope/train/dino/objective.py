"""The DINO objective (Caron et al. 2021): self-distillation from an EMA teacher on multi-crop views.

The student (backbone + DINO head) is trained; the teacher is its exponential moving average and is not
wrapped in DDP. The run folder's model is the teacher backbone, as DINO evaluates it. Deviations from
``main_dino.py`` are listed in docs/training.md.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset, normalize
from vitscope.data.multicrop import MultiCropSpec, multicrop, photometric_views, view_uniforms
from vitscope.data.stream import StreamedDataset
from vitscope.data.worker_crops import MultiCropCutter
from vitscope.metrics.knn import knn_top1
from vitscope.models import VisionTransformer
from vitscope.train.config import TrainConfig
from vitscope.train.dino.head import DINOHead, MultiCropNetwork
from vitscope.train.dino.loss import collapse_monitors, dino_loss, teacher_temperature, update_centre
from vitscope.train.distributed import DistContext
from vitscope.train.objective import Objective, autocast
from vitscope.train.schedules import cosine
from vitscope.train.supervised import build_model


@torch.no_grad()
def ema_update(teacher: list[Tensor], student: list[Tensor], momentum: float) -> None:
    """``teacher = momentum * teacher + (1 - momentum) * student`` for every pair, in one fused call
    (``torch._foreach_lerp_``: teacher moves ``1 - momentum`` of the way to the student)."""
    if len(teacher) != len(student):
        raise ValueError(f"teacher has {len(teacher)} parameters and student {len(student)}; they must match")
    torch._foreach_lerp_(teacher, [p.detach() for p in student], 1.0 - momentum)


@dataclass(frozen=True)
class DinoOptions:
    """``objective_options`` of the DINO objective; defaults are ``main_dino.py``'s ViT-S/16 recipe."""

    out_dim: int = 65536
    hidden_dim: int = 2048
    bottleneck_dim: int = 256
    head_layers: int = 3
    norm_last_layer: bool = True
    freeze_last_layer: int = 1  # epochs during which the head's last layer gets no update
    momentum_teacher: float = 0.996  # per-step cosine to 1
    warmup_teacher_temp: float = 0.04
    teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 30  # clipped to the run's epochs
    student_temp: float = 0.1
    center_momentum: float = 0.9
    drop_path: float = 0.1  # student only
    global_size: int = 224
    local_size: int = 96
    n_local: int = 8
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.4)
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    lr_reference_batch: int = 256  # lr = cfg.lr * batch_size / lr_reference_batch
    knn_every: int = 1  # epochs; kNN also runs at the end of the run
    knn_bank: int = 10000
    knn_k: int = 20
    knn_temperature: float = 0.07

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DinoOptions:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown DINO objective_options {', '.join(unknown)}; valid: {', '.join(fields)}")
        clean = {}
        for name, value in values.items():
            default = fields[name].default
            if isinstance(default, tuple):
                ok = isinstance(value, list | tuple) and len(value) == 2 and all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in value)
                value = tuple(float(v) for v in value) if ok else value
            else:
                kind = type(default)
                ok = isinstance(value, kind) if kind is not float else isinstance(value, int | float)
                ok = ok and (kind is bool or not isinstance(value, bool))
            if not ok:
                expected = "a list of 2 numbers" if isinstance(default, tuple) else type(default).__name__
                example = list(default) if isinstance(default, tuple) else default
                raise ValueError(f"objective_options.{name}: expected {expected}, got {value!r}; "
                                 f"e.g. --set objective_options.{name}={example}")
            clean[name] = value
        return cls(**clean)

    def crops(self) -> MultiCropSpec:
        return MultiCropSpec(self.global_size, self.local_size, self.n_local, self.global_scale, self.local_scale,
                             self.blur_sigma)


class DinoObjective(Objective):
    """Student and EMA teacher (backbone + head), the centre, multi-crop views and kNN monitoring."""

    name = "dino"
    grad_clip_mode = "per_tensor"

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.options = DinoOptions.from_dict(cfg.objective_options)
        self.spec = self.options.crops()
        self._monitor_sums: dict[str, float] = {}
        self._monitor_count = 0

    def setup(self, train_set: ImageDataset, eval_set: ImageDataset, ctx: DistContext) -> None:
        opts = self.options
        self.ctx, self.train_set, self.eval_set = ctx, train_set, eval_set
        backbone = build_model(self.cfg, train_set, num_classes=0, img_size=opts.global_size,
                               drop_path_rate=opts.drop_path)
        head = DINOHead(backbone.embed_dim, opts.out_dim, opts.hidden_dim, opts.bottleneck_dim, opts.head_layers,
                        opts.norm_last_layer)
        self.student = MultiCropNetwork(backbone, head).to(ctx.device)
        teacher_backbone = VisionTransformer(backbone.cfg.replace(drop_path_rate=0.0))
        self.teacher = MultiCropNetwork(teacher_backbone, copy.deepcopy(head)).to(ctx.device)
        self.teacher.load_state_dict(self.student.state_dict())
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.centre = torch.zeros(1, opts.out_dim, device=ctx.device)
        self.knn_init = self.knn()

    @property
    def trainable(self) -> nn.Module:
        return self.student

    @property
    def exported(self) -> VisionTransformer:
        return self.teacher.backbone

    def lr_scale(self) -> float:
        return self.cfg.batch_size / self.options.lr_reference_batch

    def temperature(self, epoch: int) -> float:
        opts = self.options
        warmup = min(opts.warmup_teacher_temp_epochs, self.cfg.epochs)
        return teacher_temperature(epoch, opts.warmup_teacher_temp, opts.teacher_temp, warmup)

    def worker_cutter(self, train_set: StreamedDataset) -> MultiCropCutter:
        return MultiCropCutter(self.spec)

    def views(self, images: Tensor | list[Tensor], indices: Tensor, epoch: int) -> list[Tensor]:
        """Normalised views from full uint8 images (B, C, H, W), or from the uint8 crops (one (B, C, S, S) per
        view) that workers cut from a streamed set with the same per-image uniforms."""
        mean, std = self.train_set.mean, self.train_set.std
        if isinstance(images, Tensor):
            return multicrop(images, indices, self.cfg.seed, epoch, self.spec, mean, std)
        u = view_uniforms(self.cfg.seed, epoch, indices, self.spec).to(images[0].device)
        return photometric_views([crop.float() / 255.0 for crop in images], u, self.spec, mean, std)

    def loss(self, model: nn.Module, images: Tensor | list[Tensor], labels: Tensor, indices: Tensor, epoch: int,
             generator: torch.Generator) -> Tensor:
        views = self.views(images, indices, epoch)
        temperature = self.temperature(epoch)
        with autocast(self.ctx.device, self.cfg.amp):
            with torch.no_grad():
                teacher_out = self.teacher(views[:2]).float()
            student_out = model(views).float()
        loss = dino_loss(student_out, teacher_out, self.centre, temperature, self.options.student_temp)
        for key, value in collapse_monitors(teacher_out, self.centre, temperature).items():
            self._monitor_sums[key] = self._monitor_sums.get(key, 0.0) + value
        self._monitor_count += 1
        self.centre = update_centre(self.centre, teacher_out, self.options.center_momentum, self.ctx)
        return loss

    def before_optimizer_step(self, epoch: int) -> None:
        if epoch < self.options.freeze_last_layer:
            for name, param in self.student.named_parameters():
                if "last_layer" in name:
                    param.grad = None

    @torch.no_grad()
    def after_optimizer_step(self, global_step: int, total_steps: int) -> None:
        momentum = cosine(self.options.momentum_teacher, 1.0, global_step / total_steps)
        ema_update(list(self.teacher.parameters()), list(self.student.parameters()), momentum)

    def step_scalars(self) -> dict[str, float]:
        count = max(self._monitor_count, 1)
        values = {key: total / count for key, total in self._monitor_sums.items()}
        self._monitor_sums, self._monitor_count = {}, 0
        return values

    @torch.no_grad()
    def features(self, dataset: ImageDataset | StreamedDataset, index: Tensor) -> Tensor:
        """Teacher-backbone CLS features (N, D) of ``dataset[index]``; ranks compute shares, summed."""
        backbone, ctx = self.teacher.backbone, self.ctx
        out = torch.zeros(len(index), backbone.embed_dim, device=ctx.device)
        batch = self.cfg.batch_size
        for start in range(ctx.rank * batch, len(index), batch * ctx.world_size):
            rows = index[start : start + batch]
            images = normalize(dataset.images_at(rows).to(ctx.device), dataset.mean, dataset.std)
            with autocast(ctx.device, self.cfg.amp):
                out[start : start + len(rows)] = backbone(images).float()
        return ctx.all_reduce_sum(out)

    def knn(self) -> float:
        """kNN top-1 (DINO's weighted vote) of the teacher backbone: bank of up to ``knn_bank`` training images,
        queries the eval split."""
        opts = self.options
        pick = torch.randperm(len(self.train_set), generator=torch.Generator().manual_seed(self.cfg.seed))
        bank_index = pick[: opts.knn_bank]
        bank = self.features(self.train_set, bank_index)
        queries = self.features(self.eval_set, torch.arange(len(self.eval_set)))
        return knn_top1(bank, self.train_set.labels[bank_index], queries, self.eval_set.labels,
                        self.train_set.num_classes, k=opts.knn_k, temperature=opts.knn_temperature)

    def evaluate(self, ctx: DistContext, epoch: int) -> dict[str, float]:
        last = epoch + 1 >= self.cfg.epochs
        if (epoch + 1) % self.options.knn_every and not last:
            return {}
        return {"knn_top1": self.knn(), "knn_top1_init": self.knn_init}

    def state_dict(self) -> dict[str, Any]:
        # the collapse monitors' open window: the first metrics row after a resume averages the same steps
        return {"student": self.student.state_dict(), "teacher": self.teacher.state_dict(),
                "centre": self.centre.cpu(), "knn_top1_init": self.knn_init,
                "monitor_sums": dict(self._monitor_sums), "monitor_count": self._monitor_count}

    def restore(self, checkpoint: Path, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])
        self.teacher.load_state_dict(state["teacher"])
        self.centre = state["centre"].to(self.ctx.device)
        self.knn_init = state["knn_top1_init"]
        # checkpoints written before the monitors' window was kept resume with an empty one
        self._monitor_sums = dict(state.get("monitor_sums", {}))
        self._monitor_count = int(state.get("monitor_count", 0))

    def summary(self) -> dict[str, Any]:
        return {"knn_top1_init": self.knn_init}
