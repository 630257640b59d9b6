"""Study: high-norm tokens and registers across architectures (arXiv 2603.25803, after Darcet et al. 2309.16588).

Two sources of models, in one list:

* trained here: vitscope ViTs with 0, 1, 4, 16 registers (``registers``) under each training objective of
  ``objectives`` (``supervised``: the baseline protocol, labelled ``reg<R>``; ``dino``: the shipped DINO recipe,
  labelled ``dino-reg<R>``), same data and seeds; every run resumes after a kill and is reused when finished;
* given: ``--model LABEL=SPEC[@WEIGHTS]`` entries (existing runs, checkpoints, timm models with local weights),
  and the preset's own list (the demo's randomly initialised timm ViT, Swin and PVT-v2; the paper's timm
  names with the user's weights).

Each model gets the census (``census``) on the evaluation split; one model may also be measured
with planted outliers (``vitscope.models.own.planted``). Every model's measurement is cached in
``models/<label>/`` (written atomically) under a key of everything that determines it (``measurement_key``),
so a rerun after a kill measures only what is missing, and a label reused for another model is measured again.
The results go to ``results.json`` (``RegistersResults``: settings, models, rows, the judged claims of seed 004 and
provenance) and ``results.csv``; ``vitscope.report.registers.page`` turns them into ``report.html``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vitscope.atomic_io import write_csv, write_json
from vitscope.data import load_dataset
from vitscope.models.own.planted import plant_outliers
from vitscope.provenance import SCHEMA_VERSION, provenance, resolve_device
from vitscope.run_folder import model_file, writer_lock
from vitscope.studies.models import ModelEntry
from vitscope.studies.registers.census import CensusSettings, run_census
from vitscope.studies.registers.presets import (
    DEMO_DINO,
    DEMO_PLANT,
    DEMO_PROBES,
    DEMO_TRAINING,
    DINO_CONFIGS,
    OBJECTIVES,
    PAPER_TRAINING,
    PRESETS,
    condition_name,
    parse_condition,
    preset_models,
)
from vitscope.studies.registers.probes import ProbeSettings, probe_model
from vitscope.studies.registers.results import RegistersResults
from vitscope.studies.runner import Launch, RunSpec, check_launcher, run_all
from vitscope.studies.sparse.presets import merge
from vitscope.train import TrainConfig, train
from vitscope.train.config import read_config_file
from vitscope.train.same_run import check_same_run


@dataclass
class RegistersStudy:
    """What to train and measure. ``preset`` (demo, paper, none) fills the defaults; explicit fields win.

    ``registers``: register counts to train (None: the preset's, none for ``paper`` and ``none``; [] trains
    nothing); ``objectives``: training
    objectives, each trains every register count (None: the preset's); ``models``: given models;
    ``plant``: ``{"model": LABEL, "layer": BLOCK (0-based), "count": K, "scale": S}`` measures that model again
    with planted outliers, as ``LABEL+planted`` (``"preset"``: the demo plants in reg0); ``census`` and
    ``probes``: their settings (``probes=None``: the preset's)."""

    preset: str = "demo"
    dataset: str = "synthetic"
    data_dir: str | None = None
    registers: list[int] | None = None
    model: str | None = None  # the preset trained with registers (default: vit-micro for demo, else vit-compact)
    objectives: list[str] | None = None  # supervised, dino (None: supervised; both for demo-dino and paper)
    objective_options: dict[str, Any] = field(default_factory=dict)  # DINO's own keys over its recipe's
    dino_config: str | None = None  # the DINO recipe: a shipped config name or file (None: the preset's)
    seeds: list[int] = field(default_factory=lambda: [0])
    models: list[ModelEntry] = field(default_factory=list)
    weights_dir: str | None = None
    plant: dict[str, Any] | str | None = "preset"
    census: CensusSettings = field(default_factory=CensusSettings)
    probes: ProbeSettings | None = None
    epochs: int | None = None
    batch_size: int | None = None
    train_images: int | None = None
    eval_images: int | None = None
    device: str = "auto"
    out: str = "vitscope-registers"
    progress: bool = True
    launcher: str = "local"  # local, slurm (one submitit job per training run), submitit-local (tests)
    slurm: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset {self.preset!r} is unknown; use {', '.join(PRESETS)}")
        if self.preset == "paper" and self.dataset == "synthetic":
            raise ValueError("the paper preset measures ImageNet validation images; pass --dataset imagefolder "
                             "--data-dir PATH (a folder of class subfolders)")
        if self.objectives is None:
            self.objectives = ["supervised", "dino"] if self.preset in ("demo-dino", "paper") else ["supervised"]
        unknown = [o for o in self.objectives if o not in OBJECTIVES]
        if unknown or not self.objectives or len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives {self.objectives} must be distinct names from {', '.join(OBJECTIVES)}")
        if self.registers is None:  # 'none' trains only the register counts asked for
            self.registers = [0, 4] if self.preset.startswith("demo") else []
        if any(r < 0 for r in self.registers):
            raise ValueError(f"register counts {self.registers} must be >= 0")
        if not self.seeds:
            raise ValueError("a study needs at least one seed")
        check_launcher(self.launcher)
        if isinstance(self.census, dict):
            self.census = CensusSettings(**self.census)
        if self.probes is None:  # the demo's fits are small enough for its time budget
            self.probes = DEMO_PROBES if self.preset.startswith("demo") else {}
        if isinstance(self.probes, dict):
            self.probes = ProbeSettings(**self.probes)
        if self.plant == "preset":
            # the demo plants in its first seed's reg0 (labelled reg0-seed<S> when there are several seeds)
            self.plant = dict(DEMO_PLANT, model=self.run_label("supervised", 0, self.seeds[0])) \
                if self.preset == "demo" and 0 in self.registers else None
        self.models = [m if isinstance(m, ModelEntry) else ModelEntry(**m) for m in self.models]
        labels = [m.label for m in self.all_models()]
        if len(set(labels)) != len(labels):
            raise ValueError(f"model labels {labels} repeat; give each --model its own label")
        if self.plant is not None and self.plant.get("model") not in labels:
            raise ValueError(f"plant model {self.plant.get('model')!r} is not one of the study's models {labels}")
        if not labels:
            raise ValueError("the study has no models: train some (--registers 0,4) or give --model LABEL=SPEC")

    def run_label(self, objective: str, registers: int, seed: int) -> str:
        return condition_name(objective, registers) + (f"-seed{seed}" if len(self.seeds) > 1 else "")

    def run_dir(self, objective: str, registers: int, seed: int) -> Path:
        return RunSpec(condition_name(objective, registers), seed).folder(self.out)

    def trained(self) -> list[tuple[str, str, int, int]]:
        """(label, objective, registers, seed) of every run to train."""
        return [(self.run_label(o, r, s), o, r, s) for o in self.objectives for r in self.registers
                for s in self.seeds]

    def all_models(self) -> list[ModelEntry]:
        """Every model measured, trained ones as entries on their run folders."""
        trained = [ModelEntry(label, str(self.run_dir(o, r, s))) for label, o, r, s in self.trained()]
        return trained + preset_models(self.preset, self.weights_dir) + list(self.models)

    def train_config(self, objective: str, registers: int, seed: int, device: str) -> TrainConfig:
        """One run's config. Every objective sees the same data (dataset, options, image counts) and seeds;
        supervised runs follow the baseline protocol below, DINO runs the shipped DINO recipe (its schedule and
        head), both with the study's ``epochs`` / ``batch_size`` when given."""
        demo = self.preset.startswith("demo")
        synthetic = self.dataset == "synthetic"
        data = {"model": self.model or ("vit-micro" if demo else "vit-compact"),
                "model_options": {"num_registers": registers},
                "dataset": self.dataset, "data_dir": self.data_dir,
                "dataset_options": {"num_images": 4096, "num_classes": 8} if synthetic else {},
                "train_images": self.train_images, "eval_images": self.eval_images,
                "seed": seed, "device": device, "out": str(self.run_dir(objective, registers, seed)),
                "progress": self.progress}
        if objective == "supervised":
            values = {**(DEMO_TRAINING if demo else PAPER_TRAINING), "protocol": "baseline"}
        else:
            values = merge(read_config_file(self.dino_config or DINO_CONFIGS["demo" if demo else "paper"]),
                           DEMO_DINO if demo else {})
            values = merge(values, {"objective_options": dict(self.objective_options)})
        values = {**values, **data, **{k: getattr(self, k) for k in ("epochs", "batch_size")
                                       if getattr(self, k) is not None}}
        values["eval_every"] = max(1, values["epochs"] // 4)
        return TrainConfig.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["models"] = [m.to_dict() for m in self.all_models()]
        return values


MIXED_SIZE_DEFAULT = 224  # the side photos of mixed sizes are viewed at when --img-size is not given


def _eval_set(study: RegistersStudy):
    """The evaluation images, a folder of mixed sizes viewed at the census side (default 224); each model then
    sees them at its own side."""
    options = ({"num_images": study.eval_images or 512, "num_classes": 8} if study.dataset == "synthetic"
               else {"mixed_size": study.census.img_size or MIXED_SIZE_DEFAULT})
    data = load_dataset(study.dataset, study.data_dir, "eval", **options)
    return data.subset(study.eval_images)


def _train_run(study: RegistersStudy, spec: RunSpec, device: str) -> dict[str, Any]:
    """One training run (resumed when its folder exists); its record is what the comparison needs."""
    objective, registers = parse_condition(spec.condition)
    cfg = study.train_config(objective, registers, spec.seed, device)
    summary = train(cfg, resume=Path(cfg.out).exists())
    evaluation = summary.get("eval") or {}
    return {"top1": evaluation.get("top1"), "knn_top1": evaluation.get("knn_top1"),
            "knn_top1_init": evaluation.get("knn_top1_init"), "epochs": summary.get("epochs"),
            "registers": registers, "seed": spec.seed, "objective": objective, "config": cfg.to_dict()}


def _weights_files(entry: ModelEntry) -> list[Path]:
    """The files an entry's weights come from: ``--weights`` and a spec that is a file or a run folder."""
    files = []
    for name in (entry.spec, entry.weights):
        path = Path(name).expanduser() if name else None
        if path is not None and path.is_dir() and model_file(path).is_file():
            files.append(model_file(path))
        elif path is not None and path.is_file():
            files.append(path)
    return files


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def measurement_key(study: RegistersStudy, entry: ModelEntry, plant: dict[str, Any] | None) -> dict[str, Any]:
    """Everything that determines one model's measurement: the entry (spec, weights, options, thresholds), the
    sha256 of its weights files, the planted outliers, the census and probe settings and the evaluation data.
    A cached measurement is reused only when its key is this one."""
    return json.loads(json.dumps({
        "entry": entry.to_dict(), "weights_sha256": {str(f): _sha256(f) for f in _weights_files(entry)},
        "planted": plant, "census": dataclasses.asdict(study.census), "probes": dataclasses.asdict(study.probes),
        "data": {"dataset": study.dataset, "data_dir": study.data_dir, "eval_images": study.eval_images}},
        default=str))


def _measure(study: RegistersStudy, entry: ModelEntry, dataset, device: torch.device, folder: Path,
             plant: dict[str, Any] | None, training: dict[str, Any] | None) -> dict[str, Any]:
    """The census of one model, cached in ``folder`` (census.json last, so its presence means done) under its
    ``measurement_key``: a cache of another model, weights or settings under the same label is measured again."""
    record_file = folder / "census.json"
    key = measurement_key(study, entry, plant)
    if record_file.is_file():
        cached = json.loads(record_file.read_text())
        if cached.get("key") == key:
            return cached
    model = entry.load()
    label = entry.label + ("+planted" if plant else "")
    hooks = plant_outliers(model, **{k: v for k, v in plant.items() if k != "model"}) if plant else None
    try:
        settings = dataclasses.replace(study.census, img_size=entry.options.get("img_size", study.census.img_size),
                                       thresholds=list(entry.thresholds) or study.census.thresholds)  # per model
        census = run_census(model, dataset, label, settings, device, progress=study.progress)
        rows = census.rows + probe_model(model, dataset, label, census.high_norm, study.probes, device=device,
                                            img_size=settings.img_size, baseline=plant is None,
                                            progress=study.progress)
    finally:
        if hooks is not None:
            hooks.remove()
    tensors = {k: v.float().contiguous() for k, v in census.tensors.items()}
    if hooks is not None:
        tensors["planted_positions"] = hooks.positions[: len(tensors["images"])].float().contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".census.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(folder / "census.safetensors")
    record = {"label": label, "key": key, "entry": entry.to_dict(), "planted": plant, "training": training,
              "tokens": census.tokens, "thresholds": census.thresholds, "histograms": census.histograms,
              "rows": rows, "num_images": len(dataset), "schema_version": SCHEMA_VERSION,
              "parameters": sum(p.numel() for p in model.parameters())}
    write_json(record_file, record)
    return record


def load_census_tensors(out: str | Path, label: str) -> dict[str, torch.Tensor]:
    """The figures' tensors of one measured model (images, norm maps, high-norm maps, CLS attention)."""
    return load_file(str(Path(out) / "models" / label / "census.safetensors"))


def run(study: RegistersStudy) -> RegistersResults:
    """Train what is missing, measure every model, judge the claims, and write results.json and results.csv."""
    with writer_lock(study.out, what="study folder"):  # one writer from the first check to results.json
        return _run(study)


def _run(study: RegistersStudy) -> RegistersResults:
    started = dt.datetime.now(dt.UTC)
    out = Path(study.out)
    device = resolve_device(study.device)
    for _, objective, registers, seed in study.trained():  # a run started with other settings is not reused
        check_same_run(study.train_config(objective, registers, seed, study.device))
    trained = study.trained()
    launch = Launch(device=study.device, launcher=study.launcher, slurm=study.slurm, name="vitscope-registers",
                    progress=study.progress)
    records = run_all([RunSpec(condition_name(o, r), s) for _, o, r, s in trained],
                      functools.partial(_train_run, study), out=study.out, record_name="training.json", launch=launch)
    training = {label: record for (label, *_), record in zip(trained, records, strict=True)}
    dataset = _eval_set(study)
    records = []
    entries = study.all_models()
    plants = [(e, None) for e in entries]
    if study.plant:
        plants += [(e, study.plant) for e in entries if e.label == study.plant["model"]]
    for k, (entry, plant) in enumerate(plants, 1):
        label = entry.label + ("+planted" if plant else "")
        if study.progress:
            print(f"[measure {k}/{len(plants)}] {label}", flush=True)
        records.append(_measure(study, entry, dataset, device, out / "models" / label, plant,
                                training.get(entry.label)))
    return write_results(study, records, started, device)


def write_results(study: RegistersStudy, records: list[dict[str, Any]], started: dt.datetime,
                  device: torch.device) -> RegistersResults:
    rows = [row for record in records for row in record["rows"]]
    for record in records:
        for metric in ("top1", "knn_top1"):
            value = (record.get("training") or {}).get(metric)
            if value is not None:
                rows.append({"model": record["label"], "group": "image", "metric": metric, "value": value,
                             "n": record["num_images"]})
    meta = provenance(config=study.to_dict(), seed=study.seeds[0], dataset=study.dataset,
                      dataset_root=study.data_dir, device=device, started=started)
    models = [{k: r[k] for k in ("label", "entry", "planted", "training", "tokens", "thresholds", "num_images",
                                 "parameters")} for r in records]
    results = RegistersResults.judged_from(rows, models, settings=study.to_dict(), provenance=meta)
    write_json(Path(study.out) / "results.json", results.to_json())
    columns = ["model", "layer", "layer_kind", "stage", "group", "metric", "value", "n", "threshold",
               "threshold_value"]
    write_csv(Path(study.out) / "results.csv", [{c: r.get(c) for c in columns} for r in rows])
    return results
