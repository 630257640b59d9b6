"""The demo's explorer page: the sparse demo's backbones before and after training, softmax vs entmax-1.5.

``vitscope demo`` calls ``explorer_demo(out)`` after its studies; it reads the run folders the sparse demo left
(``OUT/sparse/runs/<condition>/seed-<seed>``) and writes ``OUT/explorer/explorer.html`` in seconds (8 synthetic
evaluation images, vit-micro). "Before training" is the softmax run's architecture (its saved config) with the
random weights of ``torch.manual_seed(seed)``; the trainer seeds the same way before building its model, so these
are its initial weights (a 2-step demo run was within 6e-6 of them; docs/explore.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from vitscope.data import load_dataset
from vitscope.explorer import explore
from vitscope.models import VisionTransformer, ViTConfig, load_model
from vitscope.models.weights.checkpoint import CONFIG_KEY
from vitscope.provenance import resolve_device
from vitscope.run_folder import model_file
from vitscope.studies.runner import RunSpec

PAGE = Path("explorer") / "explorer.html"
CONDITIONS = {"softmax": "softmax", "entmax15": "entmax-1.5"}


def _run(out: Path, condition: str) -> tuple[Path, int] | None:
    """The first finished run folder of ``condition`` in the sparse demo's output and its seed, or None."""
    runs = sorted(RunSpec(condition, 0).folder(out / "sparse").parent.glob("seed-*"))
    for run in runs:
        if model_file(run).is_file():
            return run, int(run.name.split("-", 1)[1])
    return None


def _initial(run: Path, seed: int) -> VisionTransformer:
    with safe_open(str(model_file(run)), framework="pt") as handle:
        cfg = ViTConfig.from_dict(json.loads(handle.metadata()[CONFIG_KEY]))
    torch.manual_seed(seed)
    return VisionTransformer(cfg).eval()


def explorer_demo(out: str | Path, num_images: int = 8, device: str = "cpu") -> Path | None:
    """Write ``out/explorer/explorer.html`` from the sparse demo's runs; None when they are not there yet.
    ``device``: auto, cpu, cuda or cuda:N."""
    out = Path(out)
    found = {name: _run(out, name) for name in CONDITIONS}
    if found["softmax"] is None:
        return None
    models, labels = [], []
    run, seed = found["softmax"]
    models.append(_initial(run, seed))
    labels.append("softmax, before training")
    for name, label in CONDITIONS.items():
        if found[name] is not None:
            models.append(load_model(found[name][0]).eval())
            labels.append(f"{label}, trained")
    dataset = load_dataset("synthetic", None, "eval").subset(num_images, seed=0)
    page = explore(models, dataset, labels=labels, device=resolve_device(device),
                   title="vitscope demo: sparse-demo backbones before and after training, softmax vs entmax-1.5")
    return page.save(out / PAGE)
