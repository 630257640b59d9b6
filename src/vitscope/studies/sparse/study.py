"""Study: does sparse attention cure semantic diffusion? (arXiv 2605.23868)

DINO backbones that differ only in their attention normaliser, or in registers, are pretrained with the same
recipe, data and seeds, then judged by every measurement of ``vitscope.studies.sparse.measure``. A condition is
``<normaliser>[+reg<R>][+spec]`` (``softmax``, ``entmax15``, ``sparsemax``, ``entmax:1.3+reg4``, ``specialization``
...: ``vitscope.studies.sparse.conditions``). Given models
(``--model LABEL=SPEC[@WEIGHTS]``) are measured the same way instead of being trained.

Every (condition, seed) goes through the shared study runner: a finished run is reused, a killed one resumes
from its checkpoints, several GPUs run runs side by side, SLURM through submitit; ``gpus_per_run > 1`` trains
each run under torchrun. Results go to ``results.json`` (``{schema_version, kind, settings, rows, provenance}``),
``results.csv`` and ``summary.csv``; ``vitscope.report.sparse.page`` turns them into ``report.html``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitscope.atomic_io import write_json
from vitscope.data import load_dataset
from vitscope.data.dense_layouts import DEPTH, SEGMENTATION, load_dense
from vitscope.models import load as load_model
from vitscope.provenance import SCHEMA_VERSION, provenance, resolve_device
from vitscope.run_folder import writer_lock
from vitscope.studies.models import ModelEntry
from vitscope.studies.runner import Launch, RunSpec, check_launcher, devices, run_all
from vitscope.studies.sparse.conditions import parse_condition
from vitscope.studies.sparse.measure import DenseSets, MeasureSettings, measure_backbone
from vitscope.studies.sparse.presets import (
    DEFAULT_CONDITIONS,
    DEMO_DENSE,
    DEMO_OVERRIDES,
    MEASURE,
    PROBE_IMAGES,
    TRAIN_CONFIGS,
    merge,
)
from vitscope.studies.sparse.results import write_results
from vitscope.studies.sparse.results_file import SparseResults
from vitscope.train import TrainConfig, train
from vitscope.train.config import read_config_file
from vitscope.train.same_run import check_same_run

KIND = "sparse-study"
RECORD = "sparse.json"  # each run's measurement, in its run folder


@dataclass
class SparseStudy:
    """What to train and measure. ``preset`` (demo, compact, paper) fills the recipe and defaults; explicit
    fields win. ``seg`` / ``depth`` map a dense dataset name to its folder; ``models`` are measured, not
    trained; ``conditions=[]`` trains nothing (only ``models``)."""

    preset: str = "demo"
    dataset: str | None = None  # default: the preset's training config's
    data_dir: str | None = None
    conditions: list[str] | None = None  # default: DEFAULT_CONDITIONS[preset]
    seeds: list[int] = field(default_factory=lambda: [0])
    models: list[ModelEntry] = field(default_factory=list)
    epochs: int | None = None
    batch_size: int | None = None
    train_images: int | None = None
    eval_images: int | None = None
    probe_train_images: int | None = None
    probe_eval_images: int | None = None
    seg: dict[str, str | None] = field(default_factory=dict)  # layout name (voc, ade20k, ...) -> folder
    depth: dict[str, str | None] = field(default_factory=dict)  # layout name (nyu, depthfolder, ...) -> folder
    measure: MeasureSettings | None = None  # None: the preset's (MEASURE[preset])
    training: dict[str, Any] = field(default_factory=dict)  # extra TrainConfig keys, merged last
    device: str = "auto"
    out: str = "vitscope-sparse"
    progress: bool = True
    launcher: str = "local"
    slurm: dict[str, Any] = field(default_factory=dict)
    gpus_per_run: int = 1

    def __post_init__(self) -> None:
        if self.preset not in TRAIN_CONFIGS:
            raise ValueError(f"preset {self.preset!r} is unknown; use {', '.join(TRAIN_CONFIGS)}")
        check_launcher(self.launcher)
        if self.conditions is None:
            self.conditions = list(DEFAULT_CONDITIONS[self.preset])
        for condition in self.conditions:
            parse_condition(condition)
        if len(set(self.conditions)) != len(self.conditions):
            raise ValueError(f"conditions {self.conditions} repeat; name each once")
        if not self.seeds:
            raise ValueError("a study needs at least one seed, e.g. --seeds 0")
        if self.gpus_per_run < 1:
            raise ValueError(f"gpus_per_run={self.gpus_per_run} must be >= 1")
        if self.measure is None:
            self.measure = MeasureSettings(**MEASURE.get(self.preset, {}))
        elif isinstance(self.measure, dict):
            self.measure = MeasureSettings(**self.measure)
        self.models = [m if isinstance(m, ModelEntry) else ModelEntry(**m) for m in self.models]
        labels = [m.label for m in self.models]
        clash = sorted(set(labels) & set(self.conditions))
        if clash or len(set(labels)) != len(labels):
            raise ValueError(f"model labels {labels} must be unique and differ from the conditions {self.conditions}")
        if not self.conditions and not self.models:
            raise ValueError("the study has nothing to measure: name conditions or give --model LABEL=SPEC")
        if self.preset == "demo" and not self.seg and not self.depth:
            self.seg, self.depth = dict(DEMO_DENSE["seg"]), dict(DEMO_DENSE["depth"])
        for given, names, flag in ((self.seg, SEGMENTATION, "--seg"), (self.depth, DEPTH, "--depth")):
            unknown = sorted(set(given) - set(names))
            if unknown:
                raise ValueError(f"{flag} {', '.join(unknown)}: unknown layout; use one of {', '.join(names)} "
                                 f"(e.g. {flag} {names[0]}=/data/folder)")

    # --- training -------------------------------------------------------------------------------------------
    def train_config(self, condition: str, seed: int, device: str) -> TrainConfig:
        """The DINO run of one (condition, seed): the preset's shipped config, the study's overrides, the
        condition's normaliser, registers and specialization."""
        values = read_config_file(TRAIN_CONFIGS[self.preset])
        if self.preset == "demo":
            values = merge(values, DEMO_OVERRIDES)
        for key in ("dataset", "data_dir", "epochs", "batch_size", "train_images", "eval_images"):
            if getattr(self, key) is not None:
                values[key] = getattr(self, key)
        if self.dataset is not None and self.dataset != "synthetic":
            values.pop("dataset_options", None)
        values = merge(values, {"model_options": parse_condition(condition).model_options()})
        values = merge(values, {"seed": seed, "device": device, "out": str(self.run_dir(condition, seed)),
                                "progress": self.progress})
        return TrainConfig.from_dict(merge(values, self.training))

    def run_dir(self, condition: str, seed: int) -> Path:
        return RunSpec(condition, seed).folder(self.out)

    def launch(self) -> Launch:
        slurm = dict(self.slurm)
        if self.gpus_per_run > 1:
            slurm.setdefault("gpus_per_node", self.gpus_per_run)
        # torchrun runs use every GPU of the node: one run after another, not one run per GPU side by side
        device = "cuda" if self.gpus_per_run > 1 and self.device == "auto" else self.device
        return Launch(device=device, launcher=self.launcher, slurm=slurm, name="vitscope-sparse",
                      progress=self.progress)

    def specs(self) -> list[RunSpec]:
        """Trained runs (condition x seed), then each given model once (seed 0)."""
        return [RunSpec(c, s) for c in self.conditions for s in self.seeds] + [RunSpec(m.label, 0)
                                                                                for m in self.models]

    def data_name(self) -> str:
        return self.dataset or read_config_file(TRAIN_CONFIGS[self.preset])["dataset"]

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["models"] = [m.to_dict() for m in self.models]
        return values


def probe_sets(study: SparseStudy, cfg: TrainConfig | None):
    """(probe-training subset of the train split, evaluation subset) the probes use."""
    if cfg is None:  # a given model: the study's data with the preset's options
        cfg = study.train_config(study.conditions[0] if study.conditions else "softmax", 0, "cpu")
    sizes = PROBE_IMAGES[study.preset]
    train_count = study.probe_train_images or sizes["train"]
    eval_count = study.probe_eval_images or sizes["eval"]
    train_set = load_dataset(cfg.dataset, cfg.data_dir, "train", **cfg.dataset_options).subset(train_count)
    eval_set = load_dataset(cfg.dataset, cfg.data_dir, "eval", **cfg.dataset_options).subset(eval_count)
    return train_set, eval_set


def dense_sets(study: SparseStudy) -> DenseSets:
    """The ``--seg`` / ``--depth`` sets as (train, eval) pairs, loaded once per run; a size limit draws a seeded
    random sample (seed 0, the same images for every run), recorded in each run's ``dense_subsets``."""
    sizes = study.measure.dense_images
    out = DenseSets()
    for task, given, target in (("segmentation", study.seg, out.seg), ("depth", study.depth, out.depth)):
        for name, root in given.items():
            target[name] = tuple(load_dense(name, root, split, task=task, limit=sizes.get(split),
                                            synthetic_images=sizes.get(split)) for split in ("train", "eval"))
    return out


def torchrun_command(cfg_file: Path, gpus: int) -> list[str]:
    """The torchrun command that trains the run whose config is ``cfg_file`` on ``gpus`` processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
            "-m", "vitscope.cli", "train", "--config", str(cfg_file)]


def _train(study: SparseStudy, cfg: TrainConfig) -> dict[str, Any]:
    """Train (or resume, or reuse) one run, in this process or under torchrun."""
    run_dir = Path(cfg.out)
    if study.gpus_per_run == 1:
        return train(cfg, resume=run_dir.exists())
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        # each torchrun worker takes its local rank's GPU
        cfg_file = write_json(run_dir / "study-config.json", cfg.to_dict() | {"device": "auto"})
        command = torchrun_command(cfg_file, study.gpus_per_run)
        if (run_dir / "checkpoints").is_dir():
            command += ["--resume", str(run_dir)]
        subprocess.run(command, check=True, env=os.environ.copy())
    return json.loads(summary_file.read_text())


def _train_and_measure(study: SparseStudy, spec: RunSpec, device: str) -> dict[str, Any]:
    """The work of one runner spec: train (or reuse) and measure a condition, or measure a given model."""
    given = {m.label: m for m in study.models}
    dev = resolve_device(device)
    folder = spec.folder(study.out)
    if spec.condition in given:
        entry, cfg, summary = given[spec.condition], None, None
        model = entry.load()
        source = {"given": entry.to_dict()}
    else:
        cfg = study.train_config(spec.condition, spec.seed, device)
        summary = _train(study, cfg)
        model = load_model(cfg.out)
        source = {"trained": cfg.to_dict()}
    train_set, eval_set = probe_sets(study, cfg)
    dense = dense_sets(study)
    record = measure_backbone(model, spec.condition, train_set, eval_set, study.measure, dev, folder,
                              seed=spec.seed, progress=study.progress, dense_sets=dense)
    normaliser = getattr(getattr(model, "cfg", None), "attention", None)
    record.update({"condition": spec.condition, "seed": spec.seed, "normaliser": normaliser, "source": source,
                   "training": {k: (summary or {}).get(k) for k in ("epochs", "steps", "eval")},
                   "probe_subsets": {"train": train_set.selection, "eval": eval_set.selection},
                   "dense_subsets": {f"{kind}:{name}": {split.split: split.settings.get("subset") for split in pair}
                                     for kind, sets in (("seg", dense.seg), ("depth", dense.depth))
                                     for name, pair in sets.items()},
                   "schema_version": SCHEMA_VERSION})
    return record


def _check_given_record(entry: ModelEntry, record: Path) -> None:
    """A ValueError when ``record`` (a cached measurement) is of another model than ``entry``."""
    if not record.is_file():
        return
    cached = (json.loads(record.read_text()).get("source") or {}).get("given")
    if cached != json.loads(json.dumps(entry.to_dict())):
        old = f"{(cached or {}).get('spec')}" + (f"@{cached['weights']}" if (cached or {}).get("weights") else "")
        raise ValueError(f"--model {entry.label}={entry.spec}: {record.parent} holds the measurement of {old} under "
                         f"this label; give the model another label, or pass another --out")


def run(study: SparseStudy) -> SparseResults:
    """Train and measure every (condition, seed) and given model through the study runner; write
    results.json, results.csv and summary.csv. Returns the results (``SparseResults``)."""
    started = dt.datetime.now(dt.UTC)
    given = {m.label for m in study.models}
    with writer_lock(study.out, what="study folder"):  # one writer from the first check to results.json
        for spec in study.specs():  # a run started with other settings is neither resumed nor reused
            if spec.condition not in given:
                check_same_run(study.train_config(spec.condition, spec.seed, devices(study.device)[0]))
        for entry in study.models:  # nor a measurement of another model under the same label
            _check_given_record(entry, RunSpec(entry.label, 0).folder(study.out) / RECORD)
        records = run_all(study.specs(), functools.partial(_train_and_measure, study), out=study.out,
                          record_name=RECORD, launch=study.launch())
        meta = provenance(config=study.to_dict(), seed=study.seeds[0], dataset=study.data_name(),
                          dataset_root=study.data_dir, device=resolve_device(devices(study.device)[0]),
                          started=started)
        return write_results(study.out, study.to_dict(), records, meta)

