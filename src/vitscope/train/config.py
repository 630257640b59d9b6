"""Training configuration: one flat dataclass, loaded from YAML / JSON / TOML and ``--set key=value``."""

from __future__ import annotations

import dataclasses
import inspect
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

    objective: str = "supervised"  # supervised | dino
    objective_options: dict[str, Any] = field(default_factory=dict)  # the objective's own keys, e.g. DINO's head
    model: str = "vit-compact"  # preset, timm:NAME or run folder
    model_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"num_registers": 4}
    dataset: str = "synthetic"
    data_dir: str | None = None
    download: bool = False  # fetch cifar10 / cifar100 with torchvision's downloader into data_dir first
    dataset_options: dict[str, Any] = field(default_factory=dict)  # synthetic generator options
    stream: bool | str = "auto"  # auto | true | false: read images from disk per batch instead of decoding all
    memory_budget_gb: float = 4.0  # auto streams a split whose decoded uint8 size is at least this
    data_workers: int | None = None  # DataLoader processes that decode and crop streamed images; None: min(8, cores)
    train_images: int | None = None  # use only the first N training images
    eval_images: int | None = None
    protocol: str = "baseline"
    epochs: int = 100
    batch_size: int = 128  # global, over all ranks
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    weight_decay_end: float | None = None  # cosine schedule weight_decay -> weight_decay_end per step (DINO)
    warmup_epochs: float = 5.0
    grad_clip: float = 1.0  # max gradient norm; 0 disables
    grad_clip_mode: str | None = None  # global | per_tensor; None: the objective's choice
    label_smoothing: float = 0.1
    cutmix_alpha: float = 1.0
    mixup_alpha: float = 0.0
    crop_padding: int = 4
    eval_every: int = 1  # epochs
    checkpoint_every_steps: int = 0  # 0: at the end of every epoch only
    keep_last: int = 2  # checkpoints kept; resume falls back to an older one when the newest is damaged
    log_every_steps: int = 50
    keep_every: int | None = None  # epochs between kept model snapshots; None: 10 % of the run
    epoch_hooks: list[str] = field(default_factory=list)  # module:function(model) -> scalars, logged every epoch
    seed: int = 0
    deterministic: bool = False
    compile: bool = False
    amp: str = "auto"  # auto (bf16 on CUDA), bf16, off
    device: str = "auto"
    out: str = "runs/vitscope"
    progress: bool = True

    def __post_init__(self) -> None:
        check_types(self)
        self.protocol = canonical_protocol(self.protocol)
        positive = ("epochs", "batch_size", "eval_every", "log_every_steps", "keep_last")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.min_lr < 0:
            raise ValueError(f"lr={self.lr} must be > 0 and min_lr={self.min_lr} >= 0")
        if self.objective not in ("supervised", "dino"):
            raise ValueError(f"objective={self.objective!r} is unknown; use supervised or dino")
        if self.grad_clip_mode not in (None, "global", "per_tensor"):
            raise ValueError(f"grad_clip_mode={self.grad_clip_mode!r} is unknown; use global or per_tensor")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every={self.keep_every} must be >= 1 (epochs), or null for 10 % of the run")
        self.stream = {True: "true", False: "false"}.get(self.stream, str(self.stream).lower())
        if self.stream not in ("auto", "true", "false"):
            raise ValueError(f"stream={self.stream!r} is unknown; use auto, true or false")
        if self.memory_budget_gb <= 0 or (self.data_workers is not None and self.data_workers < 0):
            raise ValueError(f"memory_budget_gb={self.memory_budget_gb} must be > 0 and data_workers="
                             f"{self.data_workers} >= 0 (or null for min(8, cores))")
        if self.amp not in ("auto", "bf16", "off"):
            raise ValueError(f"amp={self.amp!r} is unknown; use auto, bf16 or off")
        check_dataset_options(self.dataset, self.dataset_options)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(valid))}")
        return cls(**values)


def check_dataset_options(dataset: str, options: dict[str, Any]) -> None:
    """A ValueError listing the valid keys when ``dataset_options`` holds one ``dataset`` does not take (the
    synthetic generator's arguments; for every other dataset only ``image_size``)."""
    from vitscope.data.synthetic import synthetic_scenes

    valid = ({name for name in inspect.signature(synthetic_scenes).parameters if name != "split"}
             if dataset == "synthetic" else {"image_size"})
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(f"dataset_options key(s) {', '.join(unknown)} unknown for dataset {dataset}; valid keys: "
                         f"{', '.join(sorted(valid))}")


_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,),
                                       "None": (type(None),)}


def _accepted(annotation: str) -> tuple[tuple[type, ...], str]:
    """The Python types a field annotation accepts, and its name for messages ('int or null')."""
    parts = [part.strip() for part in annotation.split("|")]
    types: tuple[type, ...] = ()
    for part in parts:
        base = part.split("[")[0]
        types += _TYPES.get(base, (dict,) if base == "dict" else (list,) if base == "list" else (object,))
    names = {"list[str]": "list of strings", "None": "null", "dict": "mapping", "list": "list", "str": "string",
             "int": "integer", "float": "number", "bool": "boolean (true/false)"}
    return types, " or ".join(names.get(part, names.get(part.split("[")[0], part)) for part in parts)


def check_types(cfg: TrainConfig) -> None:
    """A ValueError naming the key, the expected type and the value for the first mistyped key."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        types, expected = _accepted(str(f.type))
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if ok and isinstance(value, list) and "list[str]" in str(f.type):
            ok = all(isinstance(item, str) for item in value)
        if not ok:
            raise ValueError(f"config key {f.name}: expected {expected}, got {value!r} "
                             f"({type(value).__name__}); e.g. --set {f.name}={_example(f)}")


def _example(f: dataclasses.Field) -> str:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return "null" if default is None else json.dumps(default) if not isinstance(default, str) else default


def shipped_configs() -> dict[str, Path]:
    """Config files shipped inside the package (found by name: ``--config dino-demo``)."""
    folder = Path(__file__).resolve().parent.parent / "configs"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A mapping from a .yaml/.yml, .json or .toml file."""
    path = Path(path)
    shipped = shipped_configs()
    if not path.is_file() and str(path) in shipped:
        path = shipped[str(path)]
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; pass --config with a YAML, JSON or TOML file "
                                f"or a shipped config name ({', '.join(shipped)})")
    text = path.read_text()
    if path.suffix not in (".yaml", ".yml", ".json", ".toml"):
        raise ValueError(f"config file {path} must end in .yaml, .yml, .json or .toml")
    values = parse_text(text, path.suffix, f"config file {path}")
    values = {} if values is None else values  # an empty YAML file
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values")
    return values


def parse_text(text: str, suffix: str, where: str) -> Any:
    """YAML (``.yaml``/``.yml``, and ``--set`` values), JSON or TOML ``text``; a syntax error is a ValueError
    naming ``where``, the line and the column (1-based)."""
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix == ".toml":
            return tomllib.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{where}: invalid TOML: {err}") from None  # tomllib says "(at line L, column C)"
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{where}: invalid YAML{at}: {problem}") from None


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
        target[leaf] = parse_text(raw, ".set", f"--set {item!r}")
    return values


def load_config(path: str | Path | None, assignments: list[str] | None = None) -> TrainConfig:
    values = read_config_file(path) if path else {}
    return TrainConfig.from_dict(apply_overrides(values, assignments or []))
