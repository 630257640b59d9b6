"""Training-step throughput of vit-compact in vitscope vs timm's VisionTransformer, and the data pipeline's share.

Usage: python benchmarks/bench_train.py [--batch-size 128] [--repeats 10] [--device cpu|cuda] [--compile]
Both models share one configuration, initial weights and optimizer (timm's AdamW factory); with ``--compile`` also
our step through ``torch.compile`` (its warm-up timed apart). Timings are medians over repeated steps measured
side by side in one run; achieved GFLOP/s are set against the matmul peak (2048 x 2048) measured by the same run,
and the load average is printed with them.

With ``--pack K [--model vit-micro] [--compile] [--vmap]``: aggregate training images/s of K models packed into
one (``PackedViT``, batched products, stepped by ``PackedAdamW`` as packed training steps it: its flat step, and
the per-tensor step it replaced; compiled; the ``torch.func`` vmap twin) against K plain eager timm models of the
same shape stepped one after another, each with timm's AdamW, all in one run; plus the step's matrix products
alone (what a step would take if everything else were free: the floor no kernel fusion can pass).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import timm
import torch
from timm.optim import create_optimizer_v2

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.models import create  # noqa: E402
from vitscope.models.own.packed import PackedViT, VmappedModels  # noqa: E402
from vitscope.train.packed.adamw import PackedAdamW  # noqa: E402
from vitscope.train.protocols import Protocol, soft_cross_entropy  # noqa: E402
from vitscope.train.step_compile import StepRunner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--pack", type=int, default=0, help="K: packed vs sequential training of K models")
    parser.add_argument("--model", default=None, help="preset (default vit-compact; vit-micro with --pack)")
    parser.add_argument("--vmap", action="store_true", help="with --pack: also the torch.func vmap twin")
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

    def stepper(model, compiled=False):
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
        run = StepRunner(model, compiled, "benchmark", say=lambda line: None)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = soft_cross_entropy(run(inputs), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        if compiled:
            started = time.perf_counter()
            step()  # inductor compiles the forward and backward here
            warmups["compiled"] = time.perf_counter() - started
        return step

    warmups: dict[str, float] = {}
    fns = {"ours": stepper(ours), "timm": stepper(theirs), "data": lambda: protocol(images, labels, generator)}
    if args.compile:
        twin = create(args.model or "vit-compact").to(device)
        twin.load_state_dict(ours.state_dict())
        fns["ours compiled"] = stepper(twin, compiled=True)
    load_before = os.getloadavg()
    medians = interleaved_medians(fns, args.repeats, sync=sync)
    square = torch.randn(2048, 2048, device=device)
    peak = 2 * 2048 ** 3 / interleaved_medians({"peak": lambda: square @ square}, args.repeats, sync=sync)["peak"] / 1e9
    load_after = os.getloadavg()
    b = args.batch_size
    flops = train_flops_per_image(cfg) * b
    t_timm, t_data = medians["timm"], medians["data"]
    rows = [[f"vitscope {args.model or 'vit-compact'} step{' compiled' if name == 'ours compiled' else ''}",
             f"{medians[name] * 1e3:.1f}", f"{b / medians[name]:,.0f}", f"{t_timm / medians[name]:.2f}x timm",
             f"{flops / medians[name] / 1e9:.1f} ({flops / medians[name] / 1e9 / peak:.0%})"]
            for name in ("ours", "ours compiled") if name in medians]
    rows += [["timm VisionTransformer step", f"{t_timm * 1e3:.1f}", f"{b / t_timm:,.0f}", "1.00x",
              f"{flops / t_timm / 1e9:.1f} ({flops / t_timm / 1e9 / peak:.0%})"],
             ["data pipeline (crop, flip, AutoAugment, CutMix, smoothing)", f"{t_data * 1e3:.1f}", f"{b / t_data:,.0f}",
              f"{t_data / (t_data + medians['ours']):.1%} of a step", ""]]
    print(f"machine: {machine()}; batch {b}; bf16={args.bf16}; matmul peak (2048 x 2048) {peak:.1f} GFLOP/s; load "
          f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after; compile warm-up "
          + (", ".join(f"{n} {t:.0f} s" for n, t in warmups.items()) or "none"))
    print(table(rows, ["what", "median ms", "images/s", "ratio", "GFLOP/s (of peak)"]))


def train_flops_per_image(cfg) -> float:
    """Training FLOPs per image (forward + backward = 3x the forward's multiply-adds x 2): every linear layer
    (patch embedding, qkv, proj, MLP, head) and attention's two products."""
    patches = cfg.grid_size[0] * cfg.grid_size[1]
    tokens, dim, hidden = patches + cfg.num_prefix_tokens, cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio)
    block = tokens * (dim * 3 * dim + dim * dim + 2 * dim * hidden) + 2 * tokens * tokens * dim
    forward = cfg.depth * block + patches * cfg.in_chans * cfg.patch_size ** 2 * dim + dim * cfg.num_classes
    return 3 * 2 * forward


def matmul_floor(cfg, k: int, b: int, device: torch.device, repeats: int) -> tuple[float, float]:
    """(seconds of one step's matrix products alone, matmul peak GFLOP/s at 2048 x 2048), measured side by side:
    every linear layer's forward and two backward products as (K, M, D) batched products, and attention's
    forward + backward through scaled_dot_product_attention; what a step would take if all else were free."""
    tokens, dim = cfg.grid_size[0] * cfg.grid_size[1] + cfg.num_prefix_tokens, cfg.embed_dim
    hidden, m = int(dim * cfg.mlp_ratio), b * tokens
    shapes = [(dim, 3 * dim), (dim, dim), (dim, hidden), (hidden, dim)]
    mats = {(i, o): (torch.randn(k, m, i, device=device), torch.randn(k, i, o, device=device),
                     torch.randn(k, m, o, device=device)) for i, o in shapes}
    heads = cfg.num_heads
    q, kk, v = (torch.randn(k * b, heads, tokens, dim // heads, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(k * b, heads, tokens, dim // heads, device=device)
    a = torch.randn(2048, 2048, device=device)

    def linears():
        for x, w, g in mats.values():
            torch.bmm(x, w)  # forward
            torch.bmm(g, w.transpose(1, 2))  # input gradient
            torch.bmm(x.transpose(1, 2), g)  # weight gradient

    def attention():
        torch.nn.functional.scaled_dot_product_attention(q, kk, v).backward(grad)

    medians = interleaved_medians({"linears": linears, "attention": attention, "peak": lambda: a @ a}, repeats,
                                  sync=device.type == "cuda")
    floor = cfg.depth * (medians["linears"] + medians["attention"])
    return floor, 2 * 2048 ** 3 / medians["peak"] / 1e9


def pack_benchmark(args: argparse.Namespace) -> None:
    """Images/s of K models trained packed (explicit batched layers, eager and compiled; torch.func vmap) vs K
    plain eager timm models stepped one after another, with achieved GFLOP/s against the matmul peak."""
    device, k, b = torch.device(args.device), args.pack, args.batch_size
    preset = args.model or "vit-micro"
    models = [create(preset).to(device) for _ in range(k)]
    cfg = models[0].cfg
    images = torch.randn(k, b, 3, cfg.img_size, cfg.img_size, device=device)
    labels = torch.randint(0, cfg.num_classes, (k, b), device=device)

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def sequential_timm():
        steps = []
        for model in models:
            theirs = timm.models.vision_transformer.VisionTransformer(
                img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=cfg.num_classes,
                embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio).to(device)
            theirs.load_state_dict(model.state_dict())
            steps.append((theirs, create_optimizer_v2(theirs, opt="adamw", lr=1e-3, weight_decay=0.05)))

        def step():
            for i, (model, optimizer) in enumerate(steps):
                with amp():
                    loss = torch.nn.functional.cross_entropy(model(images[i]).float(), labels[i])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        return step

    def packed(kind: str, compiled: bool = False, flat: bool = True):
        module = (PackedViT if kind == "explicit" else VmappedModels)(models).to(device)
        # what packed training steps: AdamW with each member's own lr and weight decay (device tensors)
        optimizer = PackedAdamW([list(module.parameters())], k, flat=flat)
        lr = torch.full((1, k), 1e-3, device=device)
        weight_decay = torch.full((1, k), 0.05, device=device)
        run = StepRunner(module, compiled, "benchmark", say=lambda line: None)

        def step():
            with amp():
                logits = run(module_input).float()
            loss = sum(torch.nn.functional.cross_entropy(logits[i], labels[i]) for i in range(k))
            loss.backward()
            optimizer.step(lr, weight_decay, 1.0, "global")
            optimizer.zero_grad()

        module_input = images
        if compiled:
            started = time.perf_counter()
            step()  # inductor compiles the forward and backward here
            warmups["packed compiled"] = time.perf_counter() - started
            if run.path != "compiled":
                raise RuntimeError("torch.compile failed here; run without --compile")
        return step

    warmups: dict[str, float] = {}
    fns = {"timm sequential": sequential_timm(), "packed, per-tensor AdamW (before)": packed("explicit", flat=False),
           "packed": packed("explicit")}
    if args.compile:
        fns["packed compiled"] = packed("explicit", compiled=True)
    if args.vmap:
        fns["vmap"] = packed("vmap")
    load_before = os.getloadavg()
    medians = interleaved_medians(fns, args.repeats, sync=device.type == "cuda")
    print({name: f"{k * b / t:,.0f} images/s" for name, t in medians.items()}, flush=True)  # before the floor
    floor, peak = matmul_floor(cfg, k, b, device, args.repeats)
    load_after = os.getloadavg()
    flops = train_flops_per_image(cfg) * k * b
    rate = {name: k * b / t for name, t in medians.items()}
    rows = [[f"{k} x {preset} {name}", f"{medians[name] * 1e3:.1f}", f"{rate[name]:,.0f}",
             f"{rate[name] / rate['timm sequential']:.2f}x", f"{flops / medians[name] / 1e9:.1f}",
             f"{flops / medians[name] / 1e9 / peak:.0%}"] for name in fns]
    rows.append(["matrix products alone (floor: all else free)", f"{floor * 1e3:.1f}", f"{k * b / floor:,.0f}",
                 f"{k * b / floor / rate['timm sequential']:.2f}x", f"{flops / floor / 1e9:.1f}",
                 f"{flops / floor / 1e9 / peak:.0%}"])
    print(f"machine: {machine()}; {k} models, batch {b} each; bf16={args.bf16}; {train_flops_per_image(cfg) / 1e6:.1f} "
          f"MFLOP per training image; matmul peak (2048 x 2048) {peak:.1f} GFLOP/s; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; compile warm-up "
          + (", ".join(f"{n} {t:.0f} s" for n, t in warmups.items()) or "none"))
    print(table(rows, ["what (one step of every model)", "median ms", "images/s", "vs timm sequential", "GFLOP/s",
                       "of matmul peak"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine(), "models": k, "preset": preset, "batch": b,
                                               "compile": args.compile, "bf16": args.bf16, "images_per_s": rate,
                                               "median_s": medians, "matmul_floor_s": floor, "peak_gflops": peak,
                                               "load": [load_before[0], load_after[0]], "warmup_s": warmups},
                                              indent=1))


if __name__ == "__main__":
    main()
