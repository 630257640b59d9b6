"""Streamed data: decode + crop throughput in DataLoader workers against the training step's consumption rate.

Usage: python benchmarks/bench_data.py [--cifar ../shared/data/cifar10_jpg.tar.gz] [--images 2000] [--large 128]
       [--workers 1,2] [--repeats 3] [--device cpu|cuda]

Two image sets, both streamed from a folder (a temporary one, in the page cache after the first pass):
* CIFAR: the first ``--images`` JPEGs (32 x 32) of the archive's train split, extracted;
* large: ``--large`` generated 500 x 375 JPEGs (quality 90, smooth random content, ImageNet's typical size).
Each set is cut by the supervised protocols' crop (resize to the model side, pad 4, random crop) and by DINO's
multi-crop (CIFAR: dino-compact's 2 x 32 + 8 x 16 px; large: the paper's 2 x 224 + 8 x 96 px), with 1 and 2
worker processes, batch 32; throughput is images/s over a whole pass after a warm-up pass (median of repeats).
Consumption: images/s of a vit-compact supervised step (32 px, batch 64, baseline protocol) and of a vit-compact
DINO step (dino-compact views, head hidden 256 / out_dim 1024, batch 32), both on ``--device``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from timm.optim import create_optimizer_v2
from torchvision.io import encode_jpeg

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.data.multicrop import MultiCropSpec  # noqa: E402
from vitscope.data.stream_sources import open_streamed  # noqa: E402
from vitscope.data.worker_crops import MultiCropCutter, PadCropCutter, cropped_batches  # noqa: E402
from vitscope.models import create  # noqa: E402
from vitscope.train import TrainConfig  # noqa: E402
from vitscope.train.dino.objective import DinoObjective  # noqa: E402
from vitscope.train.distributed import DistContext  # noqa: E402
from vitscope.train.protocols import Protocol, soft_cross_entropy  # noqa: E402

COMPACT_CROPS = MultiCropSpec(32, 16, 8, (0.7, 1.0), (0.2, 0.5), (0.1, 1.0))
PAPER_CROPS = MultiCropSpec(224, 96, 8)


def extract_cifar(archive: Path, count: int, out: Path) -> Path:
    """The first ``count`` train JPEGs of the archive, as ``out/train/<class>/<file>``."""
    with tarfile.open(archive) as tar:
        taken = 0
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and "train" in parts and taken < count:
                target = out / "train" / parts[-2] / parts[-1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                taken += 1
            if taken >= count:
                break
    return out


def generate_large(count: int, out: Path) -> Path:
    """``count`` smooth random 500 x 375 JPEGs (quality 90) in ``out/train/<class>/``."""
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        small = torch.rand(1, 3, 12, 16, generator=generator)
        image = (torch.nn.functional.interpolate(small, size=(375, 500), mode="bicubic")[0].clamp(0, 1) * 255)
        folder = out / "train" / f"class{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(encode_jpeg(image.to(torch.uint8), quality=90).numpy().tobytes())
    return out


def throughput(dataset, cutter, workers: int, repeats: int, batch: int = 32) -> float:
    """Images/s of decode + crop over one pass of ``dataset`` (median of ``repeats`` passes after a warm-up)."""
    batches = [torch.arange(s, min(s + batch, len(dataset))) for s in range(0, len(dataset), batch)]
    rates = []
    for repeat in range(repeats + 1):
        start = time.perf_counter()
        for _ in cropped_batches(dataset, cutter, 0, repeat, batches, workers=workers):
            pass
        if repeat:  # the first pass warms the page cache and the worker start-up path
            rates.append(len(dataset) / (time.perf_counter() - start))
    return statistics.median(rates)


def consumption(device: torch.device, repeats: int) -> dict[str, float]:
    """Images/s of a vit-compact supervised step (batch 64, 32 px) and DINO step (batch 32, compact views)."""
    ctx = DistContext(0, 1, device, False)
    data = synthetic_scenes("train", 64)
    images, labels = data.images.to(device), data.labels.to(device)
    model = create("vit-compact", num_classes=data.num_classes).to(device)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-4, weight_decay=0.05)
    protocol = Protocol("baseline", data.num_classes, data.mean, data.std)
    generator = torch.Generator(device=device).manual_seed(0)

    def supervised():
        inputs, targets = protocol(images, labels, generator)
        soft_cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    cfg = TrainConfig.from_dict({"objective": "dino", "model": "vit-compact", "batch_size": 32, "amp": "off",
                                 "device": str(device), "objective_options": {
                                     "out_dim": 1024, "hidden_dim": 256, "bottleneck_dim": 128, "global_size": 32,
                                     "local_size": 16, "n_local": 8, "global_scale": [0.7, 1.0],
                                     "local_scale": [0.2, 0.5], "blur_sigma": [0.1, 1.0], "knn_bank": 8}})
    dino = DinoObjective(cfg)
    dino.setup(synthetic_scenes("train", 32), synthetic_scenes("eval", 8), ctx)
    dino_opt = create_optimizer_v2(dino.trainable, opt="adamw", lr=1e-4, weight_decay=0.04)
    dino_images, index = images[:32], torch.arange(32)

    def dino_step():
        dino.loss(dino.trainable, dino_images, labels[:32], index, 0, generator).backward()
        dino_opt.step()
        dino_opt.zero_grad(set_to_none=True)
        dino.after_optimizer_step(0, 100)

    times = interleaved_medians({"supervised": supervised, "dino": dino_step}, repeats=repeats, warmup=1,
                                sync=device.type == "cuda")
    return {"supervised": 64 / times["supervised"], "dino": 32 / times["dino"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cifar", default=str(Path(__file__).resolve().parents[2] / "shared/data/cifar10_jpg.tar.gz"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--large", type=int, default=128)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = {}
        if Path(args.cifar).is_file():
            folder = extract_cifar(Path(args.cifar), args.images, Path(tmp) / "cifar")
            sets["CIFAR 32x32"] = (open_streamed("imagefolder", folder, "train", image_size=32),
                                   {"supervised crop 32": PadCropCutter(32, 4),
                                    "DINO 2x32 + 8x16": MultiCropCutter(COMPACT_CROPS)})
        else:
            print(f"no CIFAR archive at {args.cifar}; skipping it", file=sys.stderr)
        folder = generate_large(args.large, Path(tmp) / "large")
        sets["500x375 JPEG"] = (open_streamed("imagefolder", folder, "train", image_size=224),
                                {"supervised resize 224 + crop": PadCropCutter(224, 4),
                                 "DINO 2x224 + 8x96": MultiCropCutter(PAPER_CROPS)})
        for name, (dataset, cutters) in sets.items():
            for label, cutter in cutters.items():
                for count in workers:
                    rate = throughput(dataset, cutter, count, args.repeats)
                    rows.append([f"{name} ({len(dataset)})", label, str(count), f"{rate:,.0f}",
                                 f"{rate / count:,.0f}"])
                    print(" | ".join(rows[-1]), file=sys.stderr)
    rates = consumption(torch.device(args.device), args.repeats)
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[:3]
    print(f"machine: {machine()}; load average {' '.join(load)}")
    print(table(rows, ["images (per pass)", "crops", "workers", "images/s", "images/s per worker"]))
    print()
    print(table([["vit-compact supervised step (32 px, batch 64)", f"{rates['supervised']:,.1f}"],
                 ["vit-compact DINO step (2x32 + 8x16 px, batch 32)", f"{rates['dino']:,.1f}"]],
                ["training step on " + args.device, "images/s consumed"]))


if __name__ == "__main__":
    main()
