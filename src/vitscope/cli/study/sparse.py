"""``vitscope study sparse``: sparse attention against semantic diffusion (arXiv 2605.23868)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitscope.cli.options import add_shared, parse_seeds, positive_int
from vitscope.cli.out_folders import output_dir
from vitscope.run_folder import writer_lock


def add_parser(studies) -> None:
    """Add the ``sparse`` study to ``vitscope study``'s subcommands."""
    sp = studies.add_parser("sparse", help="sparse attention vs semantic diffusion, DINO-pretrained (arXiv 2605.23868)",
                            description="Pretrains DINO backbones that differ only in their attention normaliser "
                                        "(or registers, or CLS/patch Specialization) and measures each: linear "
                                        "and kNN probes, dense probes, attention sparsity, MAD and entropy, "
                                        "semantic diffusion; judges the paper's claims; writes report.html.")
    sp.add_argument("--preset", default="demo", choices=["demo", "compact", "paper"],
                    help="demo: synthetic scenes, vit-micro, minutes on a CPU; compact: CIFAR-100 / Tiny-ImageNet, "
                         "vit-compact (GPU hours); paper: ImageNet-1k, ViT-S/16, 200 epochs (many GPUs)")
    sp.add_argument("--conditions", default=None,
                    help="comma-separated <normaliser>[+reg<R>][+spec], e.g. softmax,entmax15,softmax+reg4,"
                         "specialization (default by preset; '' trains nothing and measures only --model). "
                         "'specialization' (softmax+spec) is CLS/patch Specialization as vitscope reads it (the seed "
                         "names it without describing it): the CLS token's own parameters in every LayerNorm and in "
                         "the qkv projections of the first third of the blocks, after arXiv 2602.08626 "
                         "(docs/sparse-study.md)")
    sp.add_argument("--seeds", default=None,
                    help="comma-separated seeds, e.g. 0,1,2 (default 0; --seed N is --seeds N)")
    sp.add_argument("--model", dest="models", action="append", default=[], metavar="LABEL=SPEC[@WEIGHTS]",
                    help="measure an existing run folder, checkpoint or timm model with local weights instead of "
                         "training (repeatable; default: none)")
    sp.add_argument("--img-size", type=positive_int, default=None, metavar="N",
                    help="input side in pixels for every --model (its position table resampled; a multiple of its "
                         "patch size), e.g. 224 for DINOv2's patch-14 models, whose own default is 518 (default: "
                         "each model's own size); trained conditions keep the preset's crop sizes")
    sp.add_argument("--dataset", default=None, help="pretraining and probe data (default by preset)")
    sp.add_argument("--data-dir", default=None,
                    help="dataset folder or archive (default by preset; none for synthetic)")
    sp.add_argument("--seg", action="append", default=[], metavar="NAME=PATH",
                    help="a segmentation set for the dense probes (repeatable; default: the preset's)")
    sp.add_argument("--depth", action="append", default=[], metavar="NAME=PATH",
                    help="a depth set for the dense probes (repeatable; default: the preset's)")
    sp.add_argument("--epochs", type=int, default=None, help="pretraining epochs (default: the preset's)")
    sp.add_argument("--train-images", type=int, default=None,
                    help="pretrain on a class-stratified sample of N images (default: the preset's)")
    sp.add_argument("--eval-images", type=int, default=None,
                    help="DINO's kNN monitor on N evaluation images (default: the preset's)")
    sp.add_argument("--probe-images", type=int, default=None,
                    help="fit the probes on N training images (default: the preset's)")
    sp.add_argument("--launcher", default="local", choices=["local", "slurm"],
                    help="slurm: one submitit job per (condition, seed); needs the 'slurm' extra")
    sp.add_argument("--gpus-per-run", type=int, default=1, help="train each run under torchrun on G GPUs")
    add_shared(sp, decided_by={"batch_size": "the preset's", "seed": "0, as --seeds"}, device="auto", batch_size=None,
               seed=None, out="vitscope-sparse")
    sp.set_defaults(handler=run_sparse)


def named_paths(items: list[str], flag: str) -> dict[str, str]:
    """``NAME=PATH`` values -> {name: path}; a bad form names the expected one."""
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{flag} {item!r} needs the form NAME=PATH, e.g. {flag} voc=/data/VOCdevkit")
        out[name] = path
    return out


def run_sparse_study(**options) -> Path:
    from vitscope.report.sparse.page import build_report
    from vitscope.studies.sparse.study import SparseStudy, run

    study = SparseStudy(**options)  # checks the options
    # then the folder is made, and locked until the report is written (one writer per study folder)
    with writer_lock(output_dir(study.out), what="study folder"):
        run(study)
        return build_report(study.out)


def run_sparse(args: argparse.Namespace) -> int:
    from vitscope.studies.models import parse_model_entries

    conditions = None if args.conditions is None else [c for c in args.conditions.split(",") if c.strip()]
    if args.img_size is not None and not args.models:
        raise ValueError(f"--img-size {args.img_size} sets the input side of --model entries, and none is given; "
                         "trained conditions keep the preset's crop sizes (drop --img-size, or add --model LABEL=SPEC)")
    report = run_sparse_study(
        preset=args.preset, dataset=args.dataset, data_dir=args.data_dir, conditions=conditions,
        seeds=parse_seeds(args.seeds, args.seed), models=parse_model_entries(args.models, img_size=args.img_size),
        epochs=args.epochs, batch_size=args.batch_size, train_images=args.train_images,
        eval_images=args.eval_images, probe_train_images=args.probe_images,
        seg=named_paths(args.seg, "--seg"), depth=named_paths(args.depth, "--depth"),
        device=args.device, out=args.out, launcher=args.launcher, gpus_per_run=args.gpus_per_run)
    print(f"report: {report}")
    return 0


def sparse_demo(out: Path, device: str, seed: int, batch_size: int | None) -> Path:
    """The sparse study's demo: softmax against entmax-1.5 on synthetic scenes (the demo preset)."""
    from vitscope.cli.demo import demo_seeds

    return run_sparse_study(preset="demo", seeds=demo_seeds(seed), batch_size=batch_size, device=device,
                            out=str(out))
