"""Feature extraction of a real ViT-S/14 at 224 px through ``probe knn``'s path, against a plain timm forward.

Usage: python benchmarks/bench_real.py [--images 32] [--batch-size 16] [--repeats 3] [--threads 1] [--clock cpu|wall]

Model: ``timm:vit_small_patch14_dinov2`` with ../shared/data/dinov2s_imgfocus_timm.safetensors at 224 px (its random
twin when the file is absent: the cost is the same). Images: a seeded CIFAR-10 sample from ../shared/data (synthetic
scenes when absent), decoded once before timing. Both sides feed the same batches the same way (``model_batches``:
resize to 224 with the model's interpolation, its normalisation):
- ``timm forward``: ``model.forward_features(batch)`` under ``torch.no_grad``, what a timm user writes;
- ``probe knn, no cache``: ``extract_features(model, data, "last", cache=False)``, the backbone pass of ``probe
  knn`` (tokens recorded after the final norm, copied to float16);
- ``probe knn, disk cache``: the same writing a fresh cache folder each repeat, as ``vitscope probe knn`` does by
  default (weights and images hashed for the key, float16 memory-map).
Repeats run interleaved; ``--clock cpu`` (the default) times this process's CPU seconds on ``--threads`` threads,
far less sensitive than wall time to the other processes sharing a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.analyze.inputs import model_batches  # noqa: E402
from vitscope.data import load_dataset, synthetic_scenes  # noqa: E402
from vitscope.models import load  # noqa: E402
from vitscope.probes.features import extract_features  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weights = SHARED / "dinov2s_imgfocus_timm.safetensors"
    model = load("timm:vit_small_patch14_dinov2", weights=weights if weights.exists() else None, img_size=224).eval()
    cifar = SHARED / "cifar10_jpg.tar.gz"
    data = (load_dataset("cifar10", cifar, "eval") if cifar.exists() else synthetic_scenes("eval", num_images=512))
    data = data.subset(args.images, seed=0)
    scratch = Path(tempfile.mkdtemp(prefix="bench-real-"))
    counter = iter(range(10**6))

    def timm_forward() -> None:
        with torch.no_grad():
            for batch, _ in model_batches(model, data, args.batch_size, "cpu"):
                model.forward_features(batch)

    def knn_features(cache: bool):
        def run() -> None:
            extract_features(model, data, "last", batch_size=args.batch_size, device="cpu", progress=False,
                             cache=scratch / str(next(counter)) if cache else False)
        return run

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    runs = {"timm forward": timm_forward, "probe knn, no cache": knn_features(False),
            "probe knn, disk cache": knn_features(True)}
    med = interleaved_medians(runs, args.repeats, warmup=1, clock=clock)
    load_avg = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"machine: {machine()}; load average {load_avg}; clock {args.clock}; {args.images} images of "
          f"{data.name} at 224 px, batch {args.batch_size}; weights {'real' if weights.exists() else 'random'}")
    rows = [[name, f"{args.images / med[name]:.2f}", f"{med['timm forward'] / med[name]:.3f}x"] for name in runs]
    print(table(rows, ["path", "images/s", "speed vs timm forward"]))


if __name__ == "__main__":
    main()
