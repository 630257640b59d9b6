"""Study: does the training protocol alone make early ViT layers attend locally? (arXiv 2605.16390)

For every (condition, seed) a model is trained with the training engine (resumably: a finished run is
reused, an interrupted one resumes), then analysed on the evaluation split with streaming statistics:
per layer and head, mean attention distance and normalised entropy, plus top-1 accuracy. The results
go to ``results.json``, ``results.csv`` and ``summary.csv``; ``vitscope.report.locality.page`` turns them
into figures and ``report.html``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vitscope.analyze import measure_locality
from vitscope.atomic_io import write_csv, write_json
from vitscope.data import eval_batches, load_dataset
from vitscope.models import load as load_model
from vitscope.provenance import SCHEMA_VERSION, provenance, resolve_device
from vitscope.record import record_attention
from vitscope.run_folder import writer_lock
from vitscope.studies.locality.records import LocalityRun, as_runs
from vitscope.studies.locality.results import LocalityResults, head_rows, summarize
from vitscope.studies.locality.verdicts import judge_runs
from vitscope.studies.packs import check_pack, train_in_packs
from vitscope.studies.runner import Launch, RunSpec, check_launcher, devices, run_all
from vitscope.train import TrainConfig, expand_conditions, train
from vitscope.train.same_run import check_same_run
from vitscope.train.schedules import fitted_warmup

# Our optimisation settings for the paper preset (the seed states no epochs, optimiser or batch size): AdamW, batch
# 128, 200 epochs, lr 1e-3 with 10 warmup epochs and cosine decay to 1e-5, weight decay 0.05, gradient clipping at 1.
PAPER_TRAINING = {"epochs": 200, "batch_size": 128, "lr": 1e-3, "min_lr": 1e-5, "warmup_epochs": 10,
                  "weight_decay": 0.05, "grad_clip": 1.0}
DEMO_TRAINING = {"epochs": 10, "batch_size": 128, "lr": 2e-3, "min_lr": 1e-5, "warmup_epochs": 2,
                 "weight_decay": 0.05, "grad_clip": 1.0}
# Conditions when none are named: the demo compares the two a short run separates; the paper, its headline pair.
DEFAULT_CONDITIONS = {"demo": ["baseline", "baseline+cutmix"], "paper": ["baseline", "modern"]}
RECORD = "locality.json"  # each run's measurement, in its run folder


@dataclass
class LocalityStudy:
    """What to train and measure. ``preset`` fills the model and schedule; explicit fields override it."""

    dataset: str = "synthetic"
    data_dir: str | None = None
    conditions: list[str] | None = None  # default: DEFAULT_CONDITIONS[preset]
    seeds: list[int] = field(default_factory=lambda: [0])
    preset: str = "demo"
    epochs: int | None = None
    batch_size: int | None = None
    train_images: int | None = None
    eval_images: int | None = None
    device: str = "auto"
    out: str = "vitscope-study"
    early_layers: list[int] | None = None  # 0-based; default: the first quarter of the layers
    example_images: int = 4
    progress: bool = True
    launcher: str = "local"  # local (this machine), slurm (one submitit job per run), submitit-local (testing)
    slurm: dict[str, Any] = field(default_factory=dict)  # submitit parameters, e.g. {"slurm_partition": "gpu"}
    pack: int | str = 1  # train K runs at once as one packed model; "auto": as many as device memory holds
    img_size: int | None = None  # train and measure at S px (every image viewed at S); None: the dataset's own size

    def __post_init__(self) -> None:
        if self.preset not in ("paper", "demo"):
            raise ValueError(f"preset {self.preset!r} is unknown; use 'paper' or 'demo'")
        check_launcher(self.launcher)
        self.pack = check_pack(self.pack)
        if self.pack != 1 and self.launcher != "local":
            raise ValueError(f"pack={self.pack} trains packs on this machine; use --launcher local or --pack 1")
        if self.conditions is None:
            self.conditions = list(DEFAULT_CONDITIONS[self.preset])
        self.conditions = expand_conditions(",".join(self.conditions)) if self.conditions else []
        if not self.conditions or not self.seeds:
            raise ValueError("a study needs at least one condition and one seed")

    def train_config(self, condition: str, seed: int, device: str) -> TrainConfig:
        """The training run for one (condition, seed)."""
        paper, synthetic = self.preset == "paper", self.dataset == "synthetic"
        schedule = dict(PAPER_TRAINING if paper else DEMO_TRAINING)
        preset_epochs = schedule["epochs"]
        for key in ("epochs", "batch_size"):
            if getattr(self, key) is not None:
                schedule[key] = getattr(self, key)
        schedule["warmup_epochs"] = fitted_warmup(schedule["warmup_epochs"], schedule["epochs"], preset_epochs)
        if paper:  # 8 x 8 = 64 patches: CIFAR 32 px with patch 4, Tiny-ImageNet 64 px with patch 8
            model, model_options = "vit-compact", {"patch_size": 8 if self.dataset == "tiny-imagenet" else 4}
        else:
            model, model_options = "vit-micro", {}
        data_options = {"num_images": 50_000 if paper else 4096, "num_classes": 8} if synthetic else {}
        if self.img_size is not None:  # only when asked: a study without it keeps the images' own pixels
            data_options["image_size"] = self.img_size
        eval_images = self.eval_images
        if eval_images is None and synthetic and not paper:
            eval_images = 1024
        return TrainConfig(model=model, model_options=model_options, dataset=self.dataset, data_dir=self.data_dir,
                           dataset_options=data_options,
                           train_images=self.train_images, eval_images=eval_images, protocol=condition,
                           seed=seed, device=device, out=str(self.run_dir(condition, seed)),
                           progress=self.progress, eval_every=max(1, schedule["epochs"] // 10), **schedule)

    def schedule_note(self) -> str | None:
        """One line when ``epochs`` is too short for the preset's warmup, which is then scaled with the run."""
        preset = PAPER_TRAINING if self.preset == "paper" else DEMO_TRAINING
        warmup = self.train_config(self.conditions[0], self.seeds[0], "cpu").warmup_epochs
        if warmup == preset["warmup_epochs"]:
            return None
        return (f"vitscope: --epochs {self.epochs} is not longer than the {self.preset} preset's "
                f"{preset['warmup_epochs']} warmup epochs; warmup scaled with the run to {warmup:g} epochs "
                f"({preset['warmup_epochs']} of the preset's {preset['epochs']})")

    def run_dir(self, condition: str, seed: int) -> Path:
        return RunSpec(condition, seed).folder(self.out)

    def launch(self) -> Launch:
        return Launch(device=self.device, launcher=self.launcher, slurm=self.slurm, name="vitscope-locality",
                      progress=self.progress)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _train_and_measure(study: LocalityStudy, spec: RunSpec, device: str) -> dict[str, Any]:
    """Train (or resume) one run and measure it; the runner caches the record in the run folder."""
    condition, seed = spec.condition, spec.seed
    cfg = study.train_config(condition, seed, device)
    run_dir = Path(cfg.out)
    summary = train(cfg, resume=run_dir.exists())
    model = load_model(str(run_dir))
    eval_set = load_dataset(cfg.dataset, cfg.data_dir, "eval", **cfg.dataset_options).subset(cfg.eval_images)
    dev = resolve_device(device)
    result = measure_locality(model, eval_set, batch_size=cfg.batch_size, device=dev, progress=study.progress)
    stats = result.stats
    record = LocalityRun(condition, seed, accuracy=result.accuracy, layers=stats.layers, mad=stats.mad.tolist(),
                         entropy=stats.entropy.tolist(), mad_cls_at_zero=stats.mad_raw.tolist(),
                         skipped=stats.skipped.tolist(), num_images=result.num_images,
                         eval_subset=eval_set.selection, num_prefix_tokens=model.num_prefix_tokens,
                         grid_size=list(model.grid_size), patch_size=model.patch_size,
                         train_top1_eval=summary["eval"]["top1"], train_images=summary.get("train_images"),
                         train_images_per_epoch=summary.get("train_images_per_epoch"), train_config=cfg.to_dict(),
                         schema_version=SCHEMA_VERSION)
    _save_examples(model, eval_set, run_dir / "attention_examples.safetensors", study.example_images, dev)
    return record.to_json()


@torch.no_grad()
def _save_examples(model, dataset, path: Path, count: int, device: torch.device) -> None:
    """Attention maps of layers 1-2 (B, heads, T, T) and the images for the report's example figures."""
    sample = dataset.subset(count)
    images, _ = next(eval_batches(sample, count, device))
    with record_attention(model.to(device).eval(), layers=[0, 1]) as rec:
        model(images)
    save_file({"layer1": rec.maps[0].float().cpu().contiguous(), "layer2": rec.maps[1].float().cpu().contiguous(),
               "images": sample.images.contiguous()}, str(path))


def run(study: LocalityStudy) -> LocalityResults:
    """Train and measure every (condition, seed) with the study runner (resumable, side by side on several
    GPUs, or as submitit jobs); write results.json, results.csv and summary.csv.

    With ``pack`` other than 1, the runs are first trained in packs (``vitscope.studies.packs``); each
    member's run folder is that of a solo run, so the runner then only measures them.

    Returns the results (``LocalityResults``); its ``rows`` are the table (one row per condition, seed, layer, head).
    """
    started = dt.datetime.now(dt.UTC)
    if study.schedule_note():
        print(study.schedule_note(), file=sys.stderr)
    specs = [RunSpec(c, s) for c in study.conditions for s in study.seeds]
    with writer_lock(study.out, what="study folder"):  # one writer from the first check to results.json
        for spec in specs:  # a run started with other settings is neither resumed nor reused
            check_same_run(study.train_config(spec.condition, spec.seed, devices(study.device)[0]))
        train_in_packs(specs, lambda spec: study.train_config(spec.condition, spec.seed, devices(study.device)[0]),
                       out=study.out, record_name=RECORD, pack=study.pack, device=devices(study.device)[0],
                       progress=study.progress)
        records = run_all(specs, functools.partial(_train_and_measure, study), out=study.out, record_name=RECORD,
                          launch=study.launch())
        return write_results(study, records, started)


def write_results(study: LocalityStudy, records: list[dict[str, Any]] | list[LocalityRun],
                  started: dt.datetime) -> LocalityResults:
    """Judge the registry's claims on ``records`` and write results.json, results.csv and summary.csv."""
    out = Path(study.out)
    runs = as_runs(records)
    rows = head_rows(runs)
    summary = summarize(runs, study.early_layers)
    meta = provenance(config=study.to_dict() | {"training": study.train_config(study.conditions[0], 0, "auto")
                                                 .to_dict() | {"protocol": "(per condition)", "seed": "(per run)"}},
                      seed=None, dataset=study.dataset, dataset_root=study.data_dir,
                      device=resolve_device(devices(study.device)[0]), started=started)
    results = LocalityResults(settings=study.to_dict(), rows=rows, runs=runs, summary=summary,
                              claims=judge_runs(runs, dataset=study.dataset, early_layers=study.early_layers),
                              provenance=meta)
    write_json(out / "results.json", results.to_json())
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", summary)
    return results
