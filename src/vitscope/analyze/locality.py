"""Per-layer, per-head locality (MAD, entropy) of a model over a dataset, streamed."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitscope.analyze.inputs import model_batches
from vitscope.analyze.memory_plan import plan_batch
from vitscope.atomic_io import write_csv, write_json
from vitscope.attention import learned_alphas
from vitscope.data import ImageDataset
from vitscope.memory import freed_memory_returned
from vitscope.metrics import AttentionStats
from vitscope.record import block_progress, record_attention

DEFAULT_BATCH = 128  # the most images a batch holds when none is asked for and memory allows

DEFINITIONS = {
    "mad": "mean over patch queries of sum_j A[i,j] d(i,j); A restricted to patch queries and keys, rows "
           "renormalised to sum 1 unless renormalize=false; d = distance between patch centres; "
           "unit 'normalized' divides by the largest distance on the grid",
    "entropy": "mean over patch queries of -sum_j A[i,j] log A[i,j] on the renormalised patch rows, "
               "divided by log(number of patch keys)",
    "skipped": "(image, head) entries without any patch-query row holding patch mass; left out of the means",
    "min_early_mad": "smallest head MAD within the first quarter of the layers",
    "alpha": "the head's learned alpha-entmax alpha (models with attention 'entmax:learned' only)",
}


@dataclass
class LocalityResult:
    """Locality statistics of one model on one dataset, and its top-1 accuracy (None without a head)."""

    stats: AttentionStats
    accuracy: float | None
    num_images: int
    alphas: list[list[float]] | None = None  # learned alpha per block, per head (entmax:learned models)

    def summary(self) -> dict[str, Any]:
        per_layer = [
            {"layer": layer + 1, "heads": self.stats.heads[i], "mad": float(self.stats.mad[i].nanmean()),
             "entropy": float(self.stats.entropy[i].nanmean())}
            for i, layer in enumerate(self.stats.layers)
        ]
        return {"accuracy": self.accuracy, "num_images": self.num_images,
                "min_early_mad": self.stats.min_early_mad(), "layers": per_layer}


@torch.no_grad()
def measure_locality(model: nn.Module, dataset: ImageDataset, *, batch_size: int | None = None,
                     device: torch.device | str = "cpu", renormalize: bool = True, unit: str = "normalized",
                     progress: bool = True, img_size: int | None = None) -> LocalityResult:
    """Stream ``dataset`` through ``model`` in eval mode and collect MAD and entropy per layer and head.

    Images are resized to the model's input size (``img_size`` for models without a fixed one). ``batch_size``
    None: the largest batch (up to 128) that fits in memory (``vitscope.analyze.memory_plan``); a job that cannot
    fit is refused before any image runs. ``progress`` shows the plan, then a bar that moves block by block."""
    model = model.to(device).eval()
    plan = plan_batch(model, "locality", len(dataset), batch_size, default=DEFAULT_BATCH, device=device)
    if progress:
        print(plan.line("locality"), file=sys.stderr, flush=True)
    correct, seen = 0, 0
    num_classes = getattr(model, "num_classes", None) or getattr(getattr(model, "cfg", None), "num_classes", 0)
    score = num_classes == dataset.num_classes
    with freed_memory_returned(), record_attention(model, keep="stats", renormalize=renormalize, unit=unit) as rec, \
            block_progress(model, len(dataset), "locality", progress) as bar:
        for images, labels in model_batches(model, dataset, plan.batch_size, device, img_size):
            logits = model(images)
            if score:
                correct += int((logits.argmax(dim=-1) == labels).sum())
            seen += len(labels)
            bar.batch_done(len(labels))
    alphas = [values.tolist() for values in learned_alphas(model).values()] or None
    return LocalityResult(rec.stats, correct / seen if score and seen else None, seen, alphas)


def write_locality(out: str | Path, result: LocalityResult, provenance: dict[str, Any]) -> dict[str, Path]:
    """Write ``locality.json`` (summary, per-head rows, definitions, provenance) and ``locality.csv``."""
    out = Path(out)
    rows = result.stats.rows()
    if result.alphas:
        for row in rows:
            row["alpha"] = result.alphas[row["layer"] - 1][row["head"] - 1]
    payload = {
        "schema_version": provenance["schema_version"],
        "summary": result.summary(),
        "metric_options": result.stats.options,
        "definitions": DEFINITIONS,
        "heads": rows,
        "provenance": provenance,
    }
    return {"json": write_json(out / "locality.json", payload), "csv": write_csv(out / "locality.csv", rows)}
