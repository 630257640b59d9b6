"""Options and helpers shared by the commands."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_common(parser: argparse.ArgumentParser) -> None:
    """The options of every command that reads a model and a dataset."""
    parser.add_argument("--model", default="vit-micro", help="preset, timm:NAME, or run folder / weights file")
    parser.add_argument("--weights", default=None, help="local weights file for the model")
    parser.add_argument("--dataset", default="synthetic", help="dataset name (synthetic needs no directory)")
    parser.add_argument("--data-dir", default=None, help="dataset folder or archive")
    parser.add_argument("--num-images", type=int, default=None, help="use only the first N images")
    parser.add_argument("--download", action="store_true", help="fetch cifar10/cifar100 into --data-dir first")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output folder")


def add_model_changes(parser: argparse.ArgumentParser) -> None:
    """Options that modify a loaded model: input size, normaliser, registers."""
    parser.add_argument("--img-size", type=int, default=None,
                        help="input side in pixels (resamples a timm ViT's positional embedding)")
    parser.add_argument("--attention", default=None, help="swap the normaliser: softmax, sparsemax, entmax15, "
                                                          "entmax:ALPHA")
    parser.add_argument("--num-registers", type=int, default=0, help="add R register tokens to a plain ViT")


def prepare_analysis(args: argparse.Namespace, default_out: str):
    """Device, dataset, model, output folder and the provenance of a command that measures a model."""
    import torch

    from vitscope.data import load_dataset
    from vitscope.models import load
    from vitscope.provenance import provenance, resolve_device

    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    dataset = load_dataset(args.dataset, args.data_dir, "eval", download=args.download).subset(args.num_images)
    options = {"attention": args.attention, "num_registers": args.num_registers}
    if args.model.startswith("timm:") and args.img_size:
        options["img_size"] = args.img_size
    model = load(args.model, weights=args.weights, **options)
    config = {k: v for k, v in vars(args).items() if k not in ("command", "analysis", "debug", "handler")}
    config["num_images"] = len(dataset)
    meta = provenance(config=config, seed=args.seed, dataset=args.dataset, dataset_root=args.data_dir, device=device)
    return device, dataset, model, Path(args.out or default_out), meta


def print_files(files: dict[str, Path]) -> None:
    for kind, path in files.items():
        print(f"{kind:>10}: {path}")
