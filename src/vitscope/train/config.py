"""Training configuration: one flat dataclass, loaded from YAML / JSON / TOML and ``--set key=value``."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vitscope.train.protocols import canonical_protocol


@dataclass
class TrainConfig:
    """Everything a training run needs. Learning rates are per step; epochs count full passes."""

    model: str = "vit-compact"  # preset, timm:NAME or run folder
    model_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"num_registers": 4}
    dataset: str = "synthetic"
    data_dir: str | None = None
    download: bool = False  # fetch cifar10 / cifar100 with torchvision's downloader into data_dir first
    dataset_options: dict[str, Any] = field(default_factory=dict)  # synthetic generator options
    train_images: int | None = None  # use only the first N training images
    eval_images: int | None = None
    protocol: str = "baseline"
    epochs: int = 100
    batch_size: int = 128  # global, over all ranks
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_epochs: float = 5.0
    grad_clip: float = 1.0  # max gradient norm; 0 disables
    label_smoothing: float = 0.1
    cutmix_alpha: float = 1.0
    mixup_alpha: float = 0.0
    crop_padding: int = 4
    eval_every: int = 1  # epochs
    checkpoint_every_steps: int = 0  # 0: at the end of every epoch only
    log_every_steps: int = 50
    seed: int = 0
    deterministic: bool = False
    compile: bool = False
    amp: str = "auto"  # auto (bf16 on CUDA), bf16, off
    device: str = "auto"
    out: str = "runs/vitscope"
    progress: bool = True

    def __post_init__(self) -> None:
        self.protocol = canonical_protocol(self.protocol)
        positive = ("epochs", "batch_size", "eval_every", "log_every_steps")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.min_lr < 0:
            raise ValueError(f"lr={self.lr} must be > 0 and min_lr={self.min_lr} >= 0")
        if self.amp not in ("auto", "bf16", "off"):
            raise ValueError(f"amp={self.amp!r} is unknown; use auto, bf16 or off")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(valid))}")
        return cls(**values)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A mapping from a .yaml/.yml, .json or .toml file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; pass --config with a YAML, JSON or TOML file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        values = yaml.safe_load(text) or {}
    elif path.suffix == ".json":
        values = json.loads(text)
    elif path.suffix == ".toml":
        values = tomllib.loads(text)
    else:
        raise ValueError(f"config file {path} must end in .yaml, .yml, .json or .toml")
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values")
    return values


def apply_overrides(values: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings (values parsed as YAML; dotted keys reach into dicts)."""
    values = json.loads(json.dumps(values))
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"--set {item!r} needs the form key=value, e.g. --set epochs=10")
        key, raw = item.split("=", 1)
        target = values
        *parents, leaf = key.strip().split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                raise ValueError(f"--set {item!r}: {parent} is not a mapping")
        target[leaf] = yaml.safe_load(raw)
    return values


def load_config(path: str | Path | None, assignments: list[str] | None = None) -> TrainConfig:
    values = read_config_file(path) if path else {}
    return TrainConfig.from_dict(apply_overrides(values, assignments or []))
