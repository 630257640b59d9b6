"""``vitscope train``: train one model from a config file, or resume a run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitscope.cli.options import add_shared
from vitscope.cli.out_folders import created_folders

# command-line flags that are shortcuts for config keys (flag dest -> TrainConfig key)
CONFIG_FLAGS = {"dataset": "dataset", "data_dir": "data_dir", "out": "out", "device": "device",
                "batch_size": "batch_size", "seed": "seed"}


def register(commands) -> None:
    train = commands.add_parser("train", help="train a model from a config file (or resume a run)")
    train.add_argument("--config", default=None, help="YAML, JSON or TOML file of TrainConfig keys, or a shipped "
                                                      "config's name (dino-demo, dino-compact, dino-vit-s16; "
                                                      "default: none, TrainConfig's defaults)")
    train.add_argument("--set", dest="assignments", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                       help="override config keys (several pairs may follow one --set, and --set may repeat; "
                            "dotted keys reach into model_options, dataset_options, ...)")
    train.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue an interrupted run (default: none)")
    train.add_argument("--dataset", default=None,
                       help="dataset name (same as --set dataset=NAME; default: the config's)")
    train.add_argument("--data-dir", default=None, help="dataset folder or archive (same as --set data_dir=PATH; "
                                                                 "default: the config's)")
    add_shared(train, decided_by=dict.fromkeys(("device", "batch_size", "seed", "out"), "the config's"), device=None,
               batch_size=None, seed=None, out=None)
    train.epilog = ("--dataset, --data-dir, --device, --batch-size, --seed and --out override the config's keys "
                    "of the same name; --set KEY=VALUE overrides any key")
    train.set_defaults(handler=run, out_is_run_folder=True)  # the trainer checks and locks its run folder


def shortcuts(args: argparse.Namespace) -> list[str]:
    """``key=value`` overrides from the flags that were given, in ``--set`` syntax (strings quoted, so that a
    folder named ``2024`` or ``yes`` stays a string)."""
    values = {key: getattr(args, flag) for flag, key in CONFIG_FLAGS.items() if getattr(args, flag, None) is not None}
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def saved_config(run_dir: Path) -> dict:
    """The TrainConfig keys saved in ``run_dir/config.json``; a ValueError when it is not a vitscope run folder."""
    saved = run_dir / "config.json"
    try:
        values = json.loads(saved.read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        values = None
    if not isinstance(values, dict):
        raise ValueError(f"{run_dir} is not a vitscope run folder (no readable config.json with the run's config); "
                         "--resume needs a folder written by vitscope train")
    return values


def run(args: argparse.Namespace) -> int:
    from vitscope.train import TrainConfig, TrainingInterrupted, load_config, train
    from vitscope.train.config import apply_overrides

    flags = shortcuts(args)
    if args.resume:
        if args.config is not None:
            raise ValueError(f"--config {args.config} with --resume {args.resume}: a resumed run keeps the config "
                             "saved in its folder; drop --config (change single keys with --set KEY=VALUE)")
        values = apply_overrides(saved_config(Path(args.resume)), flags + args.assignments)
        values["out"] = str(args.resume)
        cfg = TrainConfig.from_dict(values)
    else:
        cfg = load_config(args.config, args.assignments + flags)
    created_folders.note(Path(cfg.out))  # removed again when the run is refused before it writes anything
    try:
        summary = train(cfg, resume=bool(args.resume))
    except TrainingInterrupted as err:
        print(f"vitscope: {err}", file=sys.stderr)
        return 130
    epochs = summary["epochs"]
    result = summary["eval"]
    if "knn_top1" in result:
        score = f"kNN top-1 {result['knn_top1']:.4f} (at initialisation {result['knn_top1_init']:.4f})"
    else:
        score = f"top-1 {result['top1']:.4f}"
    print(f"{score} after {epochs} epoch{'' if epochs == 1 else 's'}; run folder {summary['run_dir']}")
    return 0
