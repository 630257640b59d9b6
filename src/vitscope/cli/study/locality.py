"""``vitscope study locality``: training protocol vs spatial locality (arXiv 2605.16390)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitscope.cli.options import add_shared, parse_seeds, positive_int
from vitscope.cli.out_folders import output_dir
from vitscope.run_folder import writer_lock


def add_parser(studies) -> None:
    loc = studies.add_parser("locality", help="training protocol vs spatial locality (arXiv 2605.16390)")
    loc.add_argument("--dataset", default="synthetic", help="cifar10, cifar100, tiny-imagenet, imagefolder, synthetic")
    loc.add_argument("--data-dir", default=None, help="dataset folder or archive (default: none, for synthetic)")
    loc.add_argument("--conditions", default=None, help="baseline,modern | ablation | NAME,... (default by preset)")
    loc.add_argument("--seeds", default=None,
                     help="comma-separated seeds, e.g. 0,1,2 (default 0; --seed N is --seeds N)")
    loc.add_argument("--epochs", type=int, default=None,
                     help="training epochs per run (default: the preset's, paper 200, demo 10)")
    loc.add_argument("--preset", default="demo", choices=["paper", "demo"],
                     help="paper: the paper's model and data with vitscope's own schedule (200 epochs; the seed states "
                          "none), for a GPU; demo: small, minutes on a CPU")
    loc.add_argument("--train-images", type=int, default=None,
                     help="train on a seeded class-stratified sample of N training images (default: all)")
    loc.add_argument("--eval-images", type=int, default=None,
                     help="analyse a seeded class-stratified sample of N evaluation images "
                          "(default: all; 1024 for the demo on synthetic scenes)")
    loc.add_argument("--img-size", type=positive_int, default=None, metavar="S",
                     help="train and measure at S px: every image viewed at S x S (shorter side resized, centre "
                          "crop) and the model built for S (default: the dataset's own size, e.g. CIFAR's 32)")
    loc.add_argument("--launcher", default="local", choices=["local", "slurm"],
                     help="slurm: one submitit job per (condition, seed); needs the 'slurm' extra")
    loc.add_argument("--pack", default="1",
                     help="train K runs at once as one packed model (K, or auto: as many as device memory holds)")
    add_shared(loc, decided_by={"batch_size": "the preset's, 128", "seed": "0, as --seeds"}, device="auto",
               batch_size=None, seed=None, out="vitscope-study")
    loc.set_defaults(handler=run_locality)


def run_locality_study(**options) -> Path:
    from vitscope.report.locality.page import build_report
    from vitscope.studies.locality.study import LocalityStudy, run

    study = LocalityStudy(**options)  # checks the options
    # then the folder is made, and locked until the report is written (one writer per study folder)
    with writer_lock(output_dir(study.out), what="study folder"):
        run(study)
        return build_report(study.out)


def run_locality(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds, args.seed)
    conditions = args.conditions.split(",") if args.conditions else None  # None: the preset's default
    report = run_locality_study(dataset=args.dataset, data_dir=args.data_dir, conditions=conditions,
                                seeds=seeds, preset=args.preset,
                                epochs=args.epochs, batch_size=args.batch_size, train_images=args.train_images,
                                eval_images=args.eval_images, device=args.device, out=args.out,
                                launcher=args.launcher, pack=args.pack, img_size=args.img_size)
    print(f"report: {report}")
    return 0


def locality_demo(out: Path, device: str, seed: int, batch_size: int | None) -> Path:
    """The locality study's demo: Baseline against Baseline + CutMix on synthetic scenes (the demo preset),
    ``DEMO_SEEDS`` seeds each, all runs trained as one pack."""
    from vitscope.cli.demo import demo_seeds

    return run_locality_study(conditions=["baseline", "baseline+cutmix"], seeds=demo_seeds(seed), preset="demo",
                              batch_size=batch_size, device=device, out=str(out), pack="auto")
