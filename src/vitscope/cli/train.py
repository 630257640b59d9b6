"""``vitscope train``: train one model from a config file, or resume a run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(commands) -> None:
    train = commands.add_parser("train", help="train a model from a config file (or resume a run)")
    train.add_argument("--config", default=None, help="YAML, JSON or TOML file of TrainConfig keys, or a shipped "
                                                      "config's name (dino-demo, dino-compact, dino-vit-s16)")
    train.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (repeatable; dotted keys reach into model_options)")
    train.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue an interrupted run")
    train.add_argument("--out", default=None, help="run folder (same as --set out=DIR)")
    train.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N")
    train.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vitscope.train import TrainConfig, TrainingInterrupted, load_config, train
    from vitscope.train.config import apply_overrides

    shortcuts = [f"{key}={value}" for key, value in (("out", args.out), ("device", args.device)) if value]
    if args.resume:
        saved = Path(args.resume) / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"{saved} does not exist; --resume needs a run folder written by vitscope train")
        values = apply_overrides(json.loads(saved.read_text())["config"], shortcuts + args.assignments)
        values["out"] = str(args.resume)
        cfg = TrainConfig.from_dict(values)
    else:
        cfg = load_config(args.config, args.assignments + shortcuts)
    try:
        summary = train(cfg, resume=bool(args.resume))
    except TrainingInterrupted as err:
        print(f"vitscope: {err}", file=sys.stderr)
        return 130
    result = summary["eval"]
    if "knn_top1" in result:
        score = f"kNN top-1 {result['knn_top1']:.4f} (at initialisation {result['knn_top1_init']:.4f})"
    else:
        score = f"top-1 {result['top1']:.4f}"
    print(f"{score} after {summary['epochs']} epochs; run folder {summary['run_dir']}")
    return 0
