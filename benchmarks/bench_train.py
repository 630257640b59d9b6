"""Training-step throughput of vit-compact in vitscope vs timm's VisionTransformer, and the data pipeline's share.

Usage: python benchmarks/bench_train.py [--batch-size 128] [--repeats 10] [--device cpu|cuda] [--compile]
Both models share one configuration, initial weights and optimizer (timm's AdamW factory); timings are
medians over repeated steps measured in one run.

With ``--pack K [--model vit-micro]``: aggregate training images/s of K models packed into one
(``PackedViT``, batched products; and its ``torch.func`` vmap twin; both with ``PackedAdamW``, per-member lr
and weight decay, as packed training steps) against the same K models stepped one after another, each with
timm's AdamW, all in one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import timm
import torch
from timm.optim import create_optimizer_v2

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.models import create  # noqa: E402
from vitscope.models.packed import PackedViT, VmappedModels  # noqa: E402
from vitscope.train.packed.adamw import PackedAdamW  # noqa: E402
from vitscope.train.packed.state import clip_member_gradients  # noqa: E402
from vitscope.train.protocols import Protocol, soft_cross_entropy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--pack", type=int, default=0, help="K: packed vs sequential training of K models")
    parser.add_argument("--model", default=None, help="preset (default vit-compact; vit-micro with --pack)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.pack:
        pack_benchmark(args)
        return
    device = torch.device(args.device)
    sync = device.type == "cuda"
    ours = create(args.model or "vit-compact").to(device)
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
        [f"vitscope {args.model or 'vit-compact'} step", f"{t_ours * 1e3:.1f}", f"{b / t_ours:,.0f}",
         f"{t_timm / t_ours:.2f}x timm"],
        ["timm VisionTransformer step", f"{t_timm * 1e3:.1f}", f"{b / t_timm:,.0f}", "1.00x"],
        ["data pipeline (crop, flip, AutoAugment, CutMix, smoothing)", f"{t_data * 1e3:.1f}", f"{b / t_data:,.0f}",
         f"{t_data / (t_data + t_ours):.1%} of a step"],
    ]
    print(f"machine: {machine()}; batch {b}; compile={args.compile}; bf16={args.bf16}")
    print(table(rows, ["what", "median ms", "images/s", "ratio"]))


def pack_benchmark(args: argparse.Namespace) -> None:
    """Images/s of K models trained packed (explicit batched layers; torch.func vmap) vs one after another."""
    device, k, b = torch.device(args.device), args.pack, args.batch_size
    preset = args.model or "vit-micro"
    models = [create(preset).to(device) for _ in range(k)]
    cfg = models[0].cfg
    images = torch.randn(k, b, 3, cfg.img_size, cfg.img_size, device=device)
    labels = torch.randint(0, cfg.num_classes, (k, b), device=device)

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def sequential():
        steps = []
        for i, model in enumerate(models):
            optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
            run = torch.compile(model) if args.compile else model
            steps.append((i, model, run, optimizer))

        def step():
            for i, model, run, optimizer in steps:
                with amp():
                    loss = torch.nn.functional.cross_entropy(run(images[i]).float(), labels[i])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        return step

    def packed(kind):
        module = (PackedViT if kind == "explicit" else VmappedModels)(models).to(device)
        # what packed training steps: AdamW with each member's own lr and weight decay (device tensors)
        optimizer = PackedAdamW([list(module.parameters())], k)
        lr = torch.full((1, k), 1e-3, device=device)
        weight_decay = torch.full((1, k), 0.05, device=device)
        run = torch.compile(module) if args.compile else module

        def step():
            with amp():
                logits = run(images).float()
            loss = sum(torch.nn.functional.cross_entropy(logits[i], labels[i]) for i in range(k))
            loss.backward()
            clip_member_gradients(list(module.parameters()), 1.0, "global")
            optimizer.step(lr, weight_decay)
            optimizer.zero_grad()

        return step

    fns = {"sequential": sequential(), "packed": packed("explicit"), "vmap": packed("vmap")}
    medians = interleaved_medians(fns, args.repeats, sync=device.type == "cuda")
    rate = {name: k * b / t for name, t in medians.items()}
    rows = [[f"{k} x {preset} {name}", f"{medians[name] * 1e3:.1f}", f"{rate[name]:,.0f}",
             f"{rate[name] / rate['sequential']:.2f}x"] for name in fns]
    print(f"machine: {machine()}; {k} models, batch {b} each; compile={args.compile}; bf16={args.bf16}")
    print(table(rows, ["what (one step of every model)", "median ms", "images/s", "vs sequential"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine(), "models": k, "preset": preset, "batch": b,
                                               "compile": args.compile, "bf16": args.bf16, "images_per_s": rate,
                                               "median_s": medians}, indent=1))


if __name__ == "__main__":
    main()
