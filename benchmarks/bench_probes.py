"""Cost of the probes: feature extraction (with the float16 disk cache) against a plain forward, and fitting.

Usage: python benchmarks/bench_probes.py [--device cpu|cuda] [--repeats 5] [--images 512]
Extraction: vit-compact (32 px, batch 128) on synthetic scenes, every image through the frozen backbone once,
writing token layers to a fresh cache folder each repeat, against the same images through ``model(images)``
(both include feeding and normalising the images). Fitting: the logistic read-out with its default 3 x 3
lr/weight-decay sweep, the closed-form ridge read-out, and the dense segmentation head.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.analyze.inputs import model_batches  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.data.dense import synthetic_dense  # noqa: E402
from vitscope.models import create  # noqa: E402
from vitscope.probes.dense import fit_dense_head, patch_maps  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=512)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(table(extraction(args.device, args.repeats, args.images),
                ["extraction", "plain forward ms", "features ms", "ratio"]))
    print()
    print(table(fitting(args.device), ["fit", "seconds"]))


if __name__ == "__main__":
    main()
