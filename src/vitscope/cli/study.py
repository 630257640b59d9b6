"""``vitscope study NAME``: run a study end to end."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands) -> None:
    study = commands.add_parser("study", help="run a study end to end")
    studies = study.add_subparsers(dest="study", metavar="STUDY", required=True)
    loc = studies.add_parser("locality", help="training protocol vs spatial locality (arXiv 2605.16390)")
    loc.add_argument("--dataset", default="synthetic", help="cifar10, cifar100, tiny-imagenet, imagefolder, synthetic")
    loc.add_argument("--data-dir", default=None, help="dataset folder or archive")
    loc.add_argument("--conditions", default=None, help="baseline,modern | ablation | NAME,... (default by preset)")
    loc.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    loc.add_argument("--epochs", type=int, default=None)
    loc.add_argument("--preset", default="demo", choices=["paper", "demo"])
    loc.add_argument("--train-images", type=int, default=None, help="use only the first N training images")
    loc.add_argument("--eval-images", type=int, default=None, help="analyse only the first N evaluation images")
    loc.add_argument("--batch-size", type=int, default=None)
    loc.add_argument("--device", default="auto")
    loc.add_argument("--out", default="vitscope-study")
    loc.add_argument("--launcher", default="local", choices=["local", "slurm"],
                     help="slurm: one submitit job per (condition, seed); needs the 'slurm' extra")
    loc.add_argument("--pack", default="1",
                     help="train K runs at once as one packed model (K, or auto: as many as device memory holds)")
    loc.set_defaults(handler=run_locality)


def run_locality_study(**options) -> Path:
    from vitscope.report.locality import build_report
    from vitscope.studies.locality import LocalityStudy, run

    study = LocalityStudy(**options)
    run(study)
    return build_report(study.out)


def run_locality(args: argparse.Namespace) -> int:
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {args.seeds!r} must be comma-separated integers, e.g. 0,1,2") from None
    conditions = args.conditions.split(",") if args.conditions else None  # None: the preset's default
    report = run_locality_study(dataset=args.dataset, data_dir=args.data_dir, conditions=conditions,
                                seeds=seeds, preset=args.preset,
                                epochs=args.epochs, batch_size=args.batch_size, train_images=args.train_images,
                                eval_images=args.eval_images, device=args.device, out=args.out,
                                launcher=args.launcher, pack=args.pack)
    print(f"report: {report}")
    return 0
