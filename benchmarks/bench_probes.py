"""Cost of the probes: feature extraction (with the float16 disk cache) against a plain forward, and fitting.

Usage: python benchmarks/bench_probes.py [--device cpu|cuda] [--repeats 5] [--images 512]
       python benchmarks/bench_probes.py --dense segment|depth|sweep [--scale 1.0] [--old-scale 0.25] [--epochs 20]
Extraction: vit-compact (32 px, batch 128) on synthetic scenes, every image through the frozen backbone once,
writing token layers to a fresh cache folder each repeat, against the same images through ``model(images)``
(both include feeding and normalising the images). Fitting: the logistic read-out with its default 3 x 3
lr/weight-decay sweep, the closed-form ridge read-out, and the dense segmentation head.

``--dense``: issue 25's protocol, the whole ``dense_probe`` (ViT-S/16 at 224 with random weights and its random
twin, one layer, with and without CLS, 20 epochs) on piecewise textured scenes (``dense_scenes``): segment
367 + 101 images of 360 x 480 with 11 classes, depth 400 + 100 of 480 x 640, both times ``--scale``; ``sweep``:
segment at every token layer (0-12) against layer 12 alone, on the same set. New: point-sampled loss (4096 per
image), tiled evaluation; depth: the bins normalised on the x4 grid (DINOv2's head, ``bin_resolution="x4"``).
Old reference: ``loss_points="full"`` with untiled evaluation (one tile per image), depth with the bins at every
label pixel (``"label"``, as before), on ``--old-scale`` of the images (where it fits memory), with the new path
(and for depth the label-resolution bins with points and tiles) measured on the same subset in the same run;
``--label-size`` shrinks the labels where the old path would not fit at full size. Features are extracted once per
set (cached in a temporary folder) and timed apart; peak memory is this process's ``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from dense_scenes import piecewise_dense  # noqa: E402
from vitscope.analyze.inputs import model_batches  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.data.dense import synthetic_dense  # noqa: E402
from vitscope.models import create  # noqa: E402
from vitscope.probes.baselines import random_twin  # noqa: E402
from vitscope.probes.dense.probe import dense_probe, fit_dense_head, patch_maps  # noqa: E402
from vitscope.probes.dense.settings import DenseProbeSettings  # noqa: E402
from vitscope.probes.features import extract_features  # noqa: E402
from vitscope.probes.linear import fit_classifier, fit_regressor  # noqa: E402


def extraction(device: str, repeats: int, images: int) -> list[list[str]]:
    model = create("vit-compact").to(device).eval()
    data = synthetic_scenes("eval", num_images=images)
    scratch = Path(tempfile.mkdtemp(prefix="bench-probes-"))
    counter = iter(range(10**6))

    def plain():
        with torch.no_grad():
            for batch, _ in model_batches(model, data, 128, device):
                model(batch)

    def features(layers: str):
        def run():
            extract_features(model, data, layers, batch_size=128, device=device, cache=scratch / str(next(counter)),
                             progress=False)
        return run

    med = interleaved_medians({"plain": plain, "last": features("last"), "all": features("all")}, repeats,
                              sync=device == "cuda")
    return [[f"vit-compact, {images} images, layers {name}", f"{med['plain'] * 1e3:.0f}",
             f"{med[name] * 1e3:.0f}", f"{med[name] / med['plain']:.2f}x"] for name in ("last", "all")]


def fitting(device: str) -> list[list[str]]:
    torch.manual_seed(0)
    x, y = torch.randn(5000, 192), torch.randint(0, 10, (5000,))
    t = torch.randn(5000, 48)
    rows = []
    start = time.perf_counter()
    fit_classifier(x, y, 10, device=device)
    rows.append(["logistic, 5000 x 192 -> 10 classes, 3 x 3 sweep + refit, 100 epochs",
                 f"{time.perf_counter() - start:.2f}"])
    start = time.perf_counter()
    fit_regressor(x, t, device=device)
    rows.append(["ridge, 5000 x 192 -> 48 outputs, 4 penalties + refit", f"{time.perf_counter() - start:.2f}"])
    model = create("vit-compact").eval()
    dense = synthetic_dense("segmentation", "train", 256)
    feats = extract_features(model, dense.model_view(32), "last", cache=False, progress=False, device=device)[8]
    maps = patch_maps(feats, True)
    start = time.perf_counter()
    fit_dense_head(maps, dense.targets, "segmentation", num_classes=dense.num_classes, epochs=20, device=device)
    rows.append(["segmentation head, 256 images of 32 px, 2 x 192 channels, 20 epochs",
                 f"{time.perf_counter() - start:.2f}"])
    return rows


SHAPES = {"segment": ("segmentation", 367, 101, 360, 480), "depth": ("depth", 400, 100, 480, 640)}


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _probe_seconds(model, train, held, layers: str, points, untiled: bool, epochs: int, cache: Path, device: str,
                   bins_at: str):
    start = time.perf_counter()
    depth = {"bin_resolution": bins_at} if train.task == "depth" else {}
    result = dense_probe(model, train, held, layers, DenseProbeSettings(
        epochs=epochs, cache=cache, progress=False, loss_points=points, device=device,
        **({"tile_values": 1 << 62} if untiled else {}), **depth))  # 1 tile: untiled
    return time.perf_counter() - start, result


def _score(result, task: str, layer: int) -> str:
    metric = "miou" if task == "segmentation" else "rmse"
    values = [result.value(layer, metric=metric, model=m, with_cls=c) for m in ("model", "model (random init)")
              for c in (False, True)]
    return " / ".join(f"{v:.2f}" if metric == "miou" else f"{v:.3f}" for v in values)


def dense_protocol(kind: str, scale: float, old_scale: float, epochs: int, device: str,
                   label_size: tuple[int, int] | None = None) -> list[list[str]]:
    from vitscope.models import load

    task, n_train, n_eval, height, width = SHAPES["segment" if kind == "sweep" else kind]
    height, width = label_size or (height, width)
    torch.manual_seed(0)  # the same random ViT-S in every run
    model = load("timm:vit_small_patch16_224")
    layers = "all" if kind == "sweep" else "last"
    layer = 12
    rows = []
    for label, fraction, old in (("full set", scale, False), ("old-path subset", old_scale, True)):
        if fraction <= 0 or (old and kind == "sweep"):
            continue
        train = piecewise_dense(task, max(2, round(n_train * fraction)), height, width, seed=0)
        held = piecewise_dense(task, max(2, round(n_eval * fraction)), height, width, seed=1)
        cache = Path(tempfile.mkdtemp(prefix="bench-dense-"))
        start = time.perf_counter()  # features once (both backbones), the probes below read them from the cache
        for backbone in (model, random_twin(model, 0)):
            for data in (train, held):
                extract_features(backbone, data.model_view(224), layers, cache=cache, progress=False, device=device)
        extraction = time.perf_counter() - start
        new = "new: x4 bins, 4096 points" if task == "depth" else "new: 4096 points, tiles"
        runs = [(new, 4096, False, layers, "x4")]
        runs += [("label bins, 4096 points, tiles", 4096, False, layers, "label")] if old and task == "depth" else []
        runs += [("old: full loss, untiled" + (", label bins" if task == "depth" else ""), "full", True, layers,
                  "label")] if old else []
        runs += [("new, layer 12 only", 4096, False, "last", "x4")] if kind == "sweep" else []
        for name, points, untiled, which, bins_at in runs:
            seconds, result = _probe_seconds(model, train, held, which, points, untiled, epochs, cache, device,
                                             bins_at)
            rows.append([f"{kind} {len(train)}+{len(held)} ({label})", name, f"{extraction:.0f}", f"{seconds:.0f}",
                         f"{extraction + seconds:.0f}", _score(result, task, layer), f"{_peak_gb():.2f}"])
            print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--dense", default=None, choices=["segment", "depth", "sweep"])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's image counts")
    parser.add_argument("--old-scale", type=float, default=0.25, help="fraction for the old path (0: skip)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--label-size", default=None, metavar="HxW",
                        help="labels (and images) of this size instead of the issue's (e.g. 120x160)")
    args = parser.parse_args()
    if args.dense:
        import os

        print(f"machine: {machine()}; load average {os.getloadavg()}")
        size = tuple(int(v) for v in args.label_size.lower().split("x")) if args.label_size else None
        rows = dense_protocol(args.dense, args.scale, args.old_scale, args.epochs, args.device, size)
        print(table(rows, ["set", "path", "features s", "heads + eval s", "whole s",
                           "score: model / +CLS / random / +CLS", "peak GB so far"]))
        print(f"load average after: {os.getloadavg()}")
        return
    print(f"machine: {machine()}")
    print(table(extraction(args.device, args.repeats, args.images),
                ["extraction", "plain forward ms", "features ms", "ratio"]))
    print()
    print(table(fitting(args.device), ["fit", "seconds"]))


if __name__ == "__main__":
    main()
