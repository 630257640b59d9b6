"""What a command checks and loads before its work: flags that cannot apply, torch's irrelevant notices, and for the
commands that measure a model, the device, model, dataset, output folder and provenance (``prepare_analysis``)."""

from __future__ import annotations

import argparse

from vitscope.cli.out_folders import output_dir


def quiet_torch_notices() -> None:
    """Keep torch's irrelevant CPU-run notices ("No CUDA runtime is found"), and timm's UserWarnings about its own
    internals (e.g. a non-contiguous searchsorted when Swin resamples its position tables), out of vitscope's
    output (idempotent)."""
    import warnings

    from vitscope.compiled import quiet_cuda_notice

    warnings.filterwarnings("ignore", category=UserWarning, module=r"timm(\.|$)")
    quiet_cuda_notice()


def check_data_dir(args: argparse.Namespace) -> None:
    """A ValueError when ``--data-dir`` is given with ``--dataset synthetic``, which reads no directory; a
    FileNotFoundError (or a broken link's ValueError) when it does not exist and ``--download`` will not make it:
    said before any model loads (which may take half a minute)."""
    data_dir, dataset = getattr(args, "data_dir", None), getattr(args, "dataset", None)
    if dataset == "synthetic" and data_dir:
        raise ValueError(f"--data-dir {args.data_dir} is not read by --dataset synthetic (generated scenes); drop "
                         "--data-dir or name the dataset it holds with --dataset")
    if data_dir and not getattr(args, "download", False):
        from pathlib import Path

        from vitscope.data.image_trees import check_root

        check_root(Path(data_dir).expanduser(), f"the {dataset} folder or archive" if dataset else "the dataset")


def check_device_flag(args: argparse.Namespace) -> None:
    """``--device`` refused before any work (an unknown name, or a GPU this machine lacks), so that a command
    fails before writing anything (``demo`` wrote its index first)."""
    if getattr(args, "device", None) not in (None, "auto"):
        from vitscope.provenance import resolve_device

        resolve_device(args.device)


def check_launcher_flag(args: argparse.Namespace) -> None:
    """``--launcher slurm`` refused before any work on a machine without SLURM."""
    if getattr(args, "launcher", None) == "slurm":
        from vitscope.studies.runner import require_slurm

        require_slurm()


def prepare_analysis(args: argparse.Namespace, default_out: str):
    """Device, dataset, model, output folder and the provenance of a command that measures a model."""
    import torch

    from vitscope.analyze.inputs import model_view_options
    from vitscope.data import load_dataset
    from vitscope.models import load
    from vitscope.provenance import provenance, resolve_device

    check_data_dir(args)  # a run folder's own data folder, known only now, checked before its model loads
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    model = load(args.model, weights=args.weights, attention=args.attention, num_registers=args.num_registers,
                 img_size=args.img_size, pos_interp=args.pos_interp, pretrained=args.pretrained,
                 download=args.download)
    options = dict(getattr(args, "dataset_options", {}))
    if args.dataset != "synthetic":  # images of mixed sizes are viewed at the model's input side, as it sees them
        options = {**model_view_options(model, args.dataset, args.img_size), **options}
    dataset = load_dataset(args.dataset, args.data_dir, "eval", download=args.download, **options)
    dataset = dataset.subset(args.num_images, seed=args.seed)
    out = output_dir(args.out or default_out)  # after the model and data load: bad weights leave no folder
    config = {k: v for k, v in vars(args).items()
              if k not in ("command", "analysis", "debug", "handler", "shared_defaults")}
    config["num_images"] = len(dataset)
    config["model_load"] = getattr(model, "vitscope_load", None)  # origin, keys, drops, position interpolation used
    meta = provenance(config=config, seed=args.seed, dataset=args.dataset, dataset_root=args.data_dir, device=device,
                      subsets={"eval": dataset.selection})
    return device, dataset, model, out, meta
