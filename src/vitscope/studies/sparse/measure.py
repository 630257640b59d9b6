"""Every measurement of one backbone in the sparse-attention study, composed from probes, recording and metrics.

For one model (a trained run's teacher backbone, or a given ``--model``), on a probe-training split and an
evaluation split:

* image: linear-probe top-1 (logistic regression) under ``MeasureSettings.linear_protocol``: DINO's for ViT-S
  (``dino-last4``, the default: the last four blocks' CLS tokens concatenated) or the last layer's CLS alone
  (``last-cls``), with the other protocol's top-1 beside it; weighted kNN top-1 (k = 20, temperature 0.07) on the
  last layer's CLS; the per-image correctness kept in the run's record;
* attention, per layer and head (patch queries and keys): fraction of exact zeros, mean support size, mean
  attention distance (normalized) and normalised entropy;
* semantic diffusion per token layer (``vitscope.probes.diffusion``), with per-image cosines at the last layer
  and per-token correctness of the background probe;
* dense: segmentation mIoU and depth RMSE (``vitscope.probes.dense.probe``) with and without CLS on every given set,
  layer by layer on the first segmentation set; Point-in-Box per attention layer (CLS attention, averaged over
  heads) when the evaluation images have boxes;
* examples for the report: a few images, their attention maps at the first and last layer, and the last
  layer's patch tokens (for PCA maps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitscope.analyze.inputs import model_batches
from vitscope.data import ImageDataset
from vitscope.metrics import SupportAccumulator
from vitscope.metrics.knn import knn_predict
from vitscope.models import token_layout
from vitscope.probes.dense.probe import dense_probe
from vitscope.probes.dense.settings import DenseProbeSettings
from vitscope.probes.diffusion import dataset_background, diffusion_scores, semantic_diffusion
from vitscope.probes.features import depth_of, extract_features
from vitscope.probes.image import dino_last4_cls, dino_last4_layers
from vitscope.probes.linear import fit_classifier
from vitscope.probes.pib import pib_probe
from vitscope.record import record_attention


@dataclass
class MeasureSettings:
    """How each backbone is measured. ``layers``: token layers for semantic diffusion (``all``, ``last``,
    ``0,4,last``); ``fit_options``: the logistic probes' sweep (``fit_classifier`` keywords); ``linear_protocol``:
    the linear probe's feature, ``dino-last4`` (DINO's ViT-S protocol) or ``last-cls``."""

    layers: str = "all"
    linear_protocol: str = "dino-last4"
    knn_k: int = 20
    knn_temperature: float = 0.07
    diffusion_tokens: int = 4096
    random_baseline: bool = True
    example_images: int = 4
    batch_size: int = 64
    fit_options: dict[str, Any] = field(default_factory=dict)
    dense_layers: str = "all"  # layer-wise mIoU on the first segmentation set; the others at the last layer
    dense_epochs: int = 20
    dense_images: dict[str, int | None] = field(default_factory=lambda: {"train": None, "eval": None})
    pib: bool = True

    def __post_init__(self) -> None:
        if self.linear_protocol not in LINEAR_PROTOCOLS:
            raise ValueError(f"linear_protocol={self.linear_protocol!r} is unknown; use "
                             f"{' or '.join(LINEAR_PROTOCOLS)}")


LINEAR_PROTOCOLS = ("dino-last4", "last-cls")


@dataclass
class DenseSets:
    """Dense evaluation sets by name: ``seg`` and ``depth`` map a name to (train, eval) ``DenseDataset``s."""

    seg: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    depth: dict[str, tuple[Any, Any]] = field(default_factory=dict)


@torch.no_grad()
def attention_statistics(model: nn.Module, dataset: ImageDataset, batch_size: int, device: torch.device,
                         progress: bool) -> dict[str, Any]:
    """Per layer and head (lists of lists, layers numbered from 1 by position): ``zeros``, ``support``, ``mad``
    (normalized), ``entropy``, ``skipped`` (entries without patch mass); streamed, nothing kept."""
    support = SupportAccumulator()
    model = model.to(device).eval()
    bar = tqdm(total=len(dataset), unit="img", desc="attention", disable=not progress, dynamic_ncols=True)
    with record_attention(model, keep="stats", accumulators=[support]) as rec:
        for images, _ in model_batches(model, dataset, batch_size, device):
            model(images)
            bar.update(len(images))
    bar.close()
    stats = rec.stats
    return {"zeros": [support.zeros(i).tolist() for i in stats.layers],
            "support": [support.support(i).tolist() for i in stats.layers],
            "mad": stats.mad.tolist(), "entropy": stats.entropy.tolist(), "skipped": stats.skipped.tolist(),
            "patch_keys": token_layout(model).num_patches}


def image_probes(model: nn.Module, train: ImageDataset, eval_set: ImageDataset, settings: MeasureSettings,
                 device: torch.device, cache: Path | bool, progress: bool) -> dict[str, Any]:
    """Linear top-1 under ``settings.linear_protocol`` (``linear_top1``) and under the other protocol
    (``linear_top1_<protocol>``), kNN top-1 on the last layer's CLS, and each eval image's correctness (lists of
    0/1) for the study's protocol and kNN."""
    last = depth_of(model)
    options = {"batch_size": settings.batch_size, "device": device, "cache": cache, "progress": progress}
    layers = sorted(set(dino_last4_layers(last)) | {last})
    x_train, x_eval = (extract_features(model, data, layers, **options) for data in (train, eval_set))
    features = {"dino-last4": (dino_last4_cls(x_train, last), dino_last4_cls(x_eval, last)),
                "last-cls": (x_train[last].pooled("cls"), x_eval[last].pooled("cls"))}
    classes = train.num_classes
    top1, correct, fits = {}, {}, {}
    for protocol, (a, b) in features.items():
        clf = fit_classifier(a, train.labels, classes, device=device, **settings.fit_options)
        correct[protocol] = (clf.predict(b).cpu() == eval_set.labels).int()
        top1[protocol] = float(correct[protocol].float().mean())
        fits[protocol] = {k: v for k, v in clf.settings.items() if k != "sweep"}
    chosen = settings.linear_protocol
    other = next(p for p in LINEAR_PROTOCOLS if p != chosen)
    cls_train, cls_eval = features["last-cls"]
    knn = knn_predict(cls_train.to(device), train.labels.to(device), cls_eval.to(device), classes, k=settings.knn_k,
                      temperature=settings.knn_temperature).cpu()
    knn_ok = (knn == eval_set.labels).int()
    return {"linear_top1": top1[chosen], "linear_protocol": chosen, f"linear_top1_{other}": top1[other],
            "knn_top1": float(knn_ok.float().mean()), "linear_correct": correct[chosen].tolist(),
            "knn_correct": knn_ok.tolist(), "linear_fit": fits[chosen]}


def diffusion(model: nn.Module, label: str, dataset: ImageDataset, settings: MeasureSettings,
              device: torch.device, cache: Path | bool, seed: int, progress: bool) -> dict[str, Any]:
    """Semantic-diffusion rows per token layer, and the last layer's scores with per-image cosines and
    per-token hits (kept in the run's record; verdicts are over seeds)."""
    result = semantic_diffusion(model, dataset, settings.layers, max_tokens=settings.diffusion_tokens,
                                baseline=settings.random_baseline, label=label, batch_size=settings.batch_size,
                                device=device, cache=cache, seed=seed, progress=progress,
                                fit_options=settings.fit_options)
    last = depth_of(model)
    features = extract_features(model, dataset, [last], batch_size=settings.batch_size, device=device, cache=cache,
                                progress=progress)[last]
    scores = diffusion_scores(features, dataset.labels, dataset_background(dataset, features.grid),
                              max_tokens=settings.diffusion_tokens, seed=seed, device=device,
                              fit_options=settings.fit_options)
    return {"rows": result.rows, "settings": result.settings, "last_layer": scores}


@torch.no_grad()
def save_examples(model: nn.Module, dataset: ImageDataset, count: int, path: Path, device: torch.device) -> Path:
    """Images (uint8), attention maps of the first and last layer (B, heads, T, T) and last-layer patch tokens
    (B, patches, D) of the first ``count`` images, as one safetensors file written atomically."""
    sample = ImageDataset(dataset.name, dataset.split, dataset.images[:count], dataset.labels[:count],
                          dataset.classes, dataset.mean, dataset.std, dataset.root)
    images, _ = next(model_batches(model, sample, count, device))
    last = depth_of(model) - 1
    with record_attention(model.to(device).eval(), layers=[0, last]) as rec:
        model(images)
    # the last layer's patch tokens after the final norm, by the probes' own reader (every model family)
    last_tokens = extract_features(model, sample, "last", batch_size=count, device=device, cache=False,
                                   progress=False)
    patches = next(iter(last_tokens.values())).patches
    tensors: dict[str, Tensor] = {"images": sample.images.contiguous(),
                                  "attention_first": rec.maps[0].float().cpu().contiguous(),
                                  "attention_last": rec.maps[-1].float().cpu().contiguous(),
                                  "patches_last": patches.float().cpu().contiguous()}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return path


DENSE_METRICS = {"segmentation": ("miou", "pixel_accuracy"), "depth": ("rmse", "rmse_pooled", "abs_rel", "delta1")}


def dense(model: nn.Module, label: str, sets: DenseSets, settings: MeasureSettings, device: torch.device,
          cache: Path | bool, seed: int, progress: bool) -> list[dict[str, Any]]:
    """Segmentation and depth probe rows (group ``seg:NAME`` / ``depth:NAME``), with and without CLS: every
    layer of ``settings.dense_layers`` on the first segmentation set, the last layer elsewhere."""
    rows = []
    jobs = [("seg", name, pair) for name, pair in sets.seg.items()] + [("depth", name, pair)
                                                                        for name, pair in sets.depth.items()]
    for k, (kind, name, (train, eval_set)) in enumerate(jobs):
        layers = settings.dense_layers if k == 0 and kind == "seg" else "last"
        result = dense_probe(model, train, eval_set, layers, DenseProbeSettings(
            epochs=settings.dense_epochs, baseline=False, label=label, batch_size=settings.batch_size, device=device,
            cache=cache, seed=seed, progress=progress))
        keep = DENSE_METRICS[train.task]
        rows += [r | {"group": f"{kind}:{name}"} for r in result.rows if r["metric"] in keep and "group" not in r]
    return rows


def measure_backbone(model: nn.Module, label: str, train: ImageDataset, eval_set: ImageDataset,
                     settings: MeasureSettings, device: torch.device, folder: Path, seed: int = 0,
                     progress: bool = True, dense_sets: DenseSets | None = None) -> dict[str, Any]:
    """Every measurement of one backbone (see the module docstring); examples go to
    ``folder/examples.safetensors``. Features are cached in ``folder/features`` so a rerun reads them back."""
    folder.mkdir(parents=True, exist_ok=True)
    cache = folder / "features"
    model = model.to(device).eval()
    layout = token_layout(model)  # every family's token geometry (a timm model has no top-level grid_size)
    record: dict[str, Any] = {"label": label, "parameters": sum(p.numel() for p in model.parameters()),
                              "num_prefix_tokens": layout.num_prefix_tokens, "num_registers": layout.num_registers,
                              "grid_size": list(layout.grid_size), "depth": depth_of(model),
                              "probe_train_images": len(train), "eval_images": len(eval_set)}
    record["image"] = image_probes(model, train, eval_set, settings, device, cache, progress)
    record["attention"] = attention_statistics(model, eval_set, settings.batch_size, device, progress)
    record["diffusion"] = diffusion(model, label, eval_set, settings, device, cache, seed, progress)
    record["dense"] = dense(model, label, dense_sets or DenseSets(), settings, device, cache, seed, progress)
    record["pib"] = []
    if settings.pib and "boxes" in eval_set.extras:
        record["pib"] = pib_probe(model, eval_set, "all", baseline=False, label=label,
                                  batch_size=settings.batch_size, device=device, cache=cache, seed=seed,
                                  progress=progress).rows
    save_examples(model, eval_set, settings.example_images, folder / "examples.safetensors", device)
    return record
