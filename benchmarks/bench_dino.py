"""DINO training-step time for vit-compact with softmax, entmax-1.5 and sparsemax attention (ratios in one run).

Usage: python benchmarks/bench_dino.py [--batch-size 32] [--repeats 5] [--device cpu|cuda] [--n-local 4]
Each step: multi-crop views (2 x 32 px global, n x 16 px local), teacher forward on the global views, student
forward and backward on all views, per-tensor clipping, AdamW, EMA update. Timings are medians over steps run in
alternation in one process; the head is the demo's (hidden 256, out_dim 1024) unless --out-dim is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from timm.optim import create_optimizer_v2

sys.path.insert(0, str(Path(__file__).parent))
from common import interleaved_medians, machine, table  # noqa: E402
from vitscope.data import synthetic_scenes  # noqa: E402
from vitscope.train import TrainConfig  # noqa: E402
from vitscope.train.dino.objective import DinoObjective  # noqa: E402
from vitscope.train.distributed import DistContext  # noqa: E402
from vitscope.train.engine import clip_gradients  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n-local", type=int, default=4)
    parser.add_argument("--out-dim", type=int, default=1024)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    ctx = DistContext(0, 1, device, False)
    data = synthetic_scenes("train", args.batch_size)
    eval_data = synthetic_scenes("eval", 8)
    indices = torch.arange(args.batch_size)
    images, labels = data.images.to(device), data.labels.to(device)

    def stepper(attention: str):
        cfg = TrainConfig.from_dict({
            "objective": "dino", "model": "vit-compact", "model_options": {"attention": attention},
            "batch_size": args.batch_size, "device": args.device, "amp": "bf16" if args.bf16 else "off",
            "objective_options": {"out_dim": args.out_dim, "hidden_dim": 256, "bottleneck_dim": 128,
                                  "global_size": 32, "local_size": 16, "n_local": args.n_local,
                                  "knn_bank": 8, "blur_sigma": [0.1, 1.0]}})
        torch.manual_seed(0)
        objective = DinoObjective(cfg)
        objective.setup(data, eval_data, ctx)
        optimizer = create_optimizer_v2(objective.trainable, opt="adamw", lr=1e-4, weight_decay=0.04)
        generator = torch.Generator(device=device).manual_seed(0)

        def step():
            loss = objective.loss(objective.trainable, images, labels, indices, 0, generator)
            loss.backward()
            clip_gradients(objective.trainable.parameters(), 3.0, "per_tensor")
            objective.before_optimizer_step(1)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            objective.after_optimizer_step(0, 100)

        return step

    names = ("softmax", "entmax15", "sparsemax")
    medians = interleaved_medians({name: stepper(name) for name in names}, args.repeats,
                                  sync=device.type == "cuda")
    base = medians["softmax"]
    rows = [[name, f"{medians[name] * 1e3:.0f}", f"{args.batch_size / medians[name]:,.1f}",
             f"{medians[name] / base:.2f}x"] for name in names]
    print(f"machine: {machine()}; vit-compact DINO step, batch {args.batch_size}, 2 x 32 px + {args.n_local} x 16 px "
          f"views, head out_dim {args.out_dim}, bf16={args.bf16}")
    print(table(rows, ["attention", "median ms / step", "images/s", "vs softmax"]))


if __name__ == "__main__":
    main()
