"""Training-step throughput of vit-compact in vitscope vs timm's VisionTransformer, and the data pipeline's share.

Usage: python benchmarks/bench_train.py [--batch-size 128] [--repeats 10] [--device cpu|cuda] [--compile]
Both models share one configuration, initial weights and optimizer (timm's AdamW factory); timings are
medians over repeated steps measured in one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import timm
import torch
from timm.optim import create_optimizer_v2

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.models import create  # noqa: E402
from vitscope.train.protocols import Protocol, soft_cross_entropy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = device.type == "cuda"
    ours = create("vit-compact").to(device)
    cfg = ours.cfg
    theirs = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=cfg.num_classes, embed_dim=cfg.embed_dim,
        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio).to(device)
    theirs.load_state_dict(ours.state_dict())
    data = synthetic_scenes("train", args.batch_size, num_classes=8)
    images = data.images.to(device)
    labels = (data.labels % cfg.num_classes).to(device)
    protocol = Protocol("modern", cfg.num_classes, data.mean, data.std)
    generator = torch.Generator(device=device).manual_seed(0)
    inputs, targets = protocol(images, labels, generator)

    def stepper(model):
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
        run = torch.compile(model) if args.compile else model

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = soft_cross_entropy(run(inputs), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    medians = interleaved_medians({"ours": stepper(ours), "timm": stepper(theirs),
                                   "data": lambda: protocol(images, labels, generator)}, args.repeats, sync=sync)
    t_ours, t_timm, t_data = medians["ours"], medians["timm"], medians["data"]
    b = args.batch_size
    rows = [
        ["vitscope vit-compact step", f"{t_ours * 1e3:.1f}", f"{b / t_ours:,.0f}", f"{t_timm / t_ours:.2f}x timm"],
        ["timm VisionTransformer step", f"{t_timm * 1e3:.1f}", f"{b / t_timm:,.0f}", "1.00x"],
        ["data pipeline (crop, flip, AutoAugment, CutMix, smoothing)", f"{t_data * 1e3:.1f}", f"{b / t_data:,.0f}",
         f"{t_data / (t_data + t_ours):.1%} of a step"],
    ]
    print(f"machine: {machine()}; batch {b}; compile={args.compile}; bf16={args.bf16}")
    print(table(rows, ["what", "median ms", "images/s", "ratio"]))


if __name__ == "__main__":
    main()
