"""The ``vitscope`` command. Errors print one line on stderr and exit 2 (a traceback with --debug)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import vitscope


def add_common(parser: argparse.ArgumentParser) -> None:
    """The options of every command that reads a model and a dataset (DESIGN.md section 5)."""
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitscope", description=vitscope.__doc__)
    parser.add_argument("--version", action="version", version=f"vitscope {vitscope.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("models", help="list model presets with parameter counts")
    analyze = commands.add_parser("analyze", help="measure a model on a dataset")
    kinds = analyze.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    locality = kinds.add_parser("locality", help="per-head mean attention distance and entropy")
    add_common(locality)
    locality.add_argument("--unit", default="normalized", choices=["normalized", "patch", "pixel"])
    locality.add_argument("--no-renormalize", dest="renormalize", action="store_false",
                          help="keep the raw patch mass of each row instead of renormalising it")
    norms = kinds.add_parser("norms", help="token norms per layer and high-norm (artifact) tokens")
    add_common(norms)
    norms.add_argument("--threshold", default="percentile:98", help="percentile:Q, absolute:T or auto")
    norms.add_argument("--detect-layer", type=int, default=0,
                       help="layer (numbered from 1) whose patch tokens set the threshold; 0 = the last")
    for sub in (locality, norms):
        sub.add_argument("--img-size", type=int, default=None,
                         help="input side in pixels (resamples a timm ViT's positional embedding)")
        sub.add_argument("--attention", default=None, help="swap the normaliser: softmax, sparsemax, entmax15, "
                                                           "entmax:ALPHA")
        sub.add_argument("--num-registers", type=int, default=0, help="add R register tokens to a plain ViT")
    train = commands.add_parser("train", help="train a model from a config file (or resume a run)")
    train.add_argument("--config", default=None, help="YAML, JSON or TOML file of TrainConfig keys")
    train.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (repeatable; dotted keys reach into model_options)")
    train.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue an interrupted run")
    train.add_argument("--out", default=None, help="run folder (same as --set out=DIR)")
    train.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N")
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
    demo = commands.add_parser("demo", help="the locality study's demo preset on built-in data (~10 min on a CPU)")
    demo.add_argument("--out", default="vitscope-demo")
    demo.add_argument("--device", default="auto")
    return parser


def run_locality_study(**options) -> Path:
    from vitscope.report.locality import build_report
    from vitscope.studies.locality import LocalityStudy, run

    study = LocalityStudy(**options)
    run(study)
    return build_report(study.out)


def cmd_study(args: argparse.Namespace) -> int:
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {args.seeds!r} must be comma-separated integers, e.g. 0,1,2") from None
    default = "baseline,baseline+cutmix" if args.preset == "demo" else "baseline,modern"
    report = run_locality_study(dataset=args.dataset, data_dir=args.data_dir,
                                conditions=(args.conditions or default).split(","), seeds=seeds, preset=args.preset,
                                epochs=args.epochs, batch_size=args.batch_size, train_images=args.train_images,
                                eval_images=args.eval_images, device=args.device, out=args.out,
                                launcher=args.launcher)
    print(f"report: {report}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    report = run_locality_study(conditions=["baseline", "baseline+cutmix"], seeds=[0], preset="demo",
                                device=args.device, out=args.out)
    print(f"report: {report.resolve()}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from vitscope.train import TrainConfig, TrainingInterrupted, load_config, train

    shortcuts = [f"{key}={value}" for key, value in (("out", args.out), ("device", args.device)) if value]
    if args.resume:
        saved = Path(args.resume) / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"{saved} does not exist; --resume needs a run folder written by vitscope train")
        from vitscope.train.config import apply_overrides

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
    print(f"top-1 {summary['eval']['top1']:.4f} after {summary['epochs']} epochs; run folder {summary['run_dir']}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from vitscope.models import PRESETS, count_parameters, create

    print(f"{'preset':<14}{'params':>12}  {'image':>5} {'patch':>5} {'depth':>5} {'width':>5} {'heads':>5}")
    for name, cfg in PRESETS.items():
        params = count_parameters(create(name))
        print(f"{name:<14}{params:>12,}  {cfg.img_size:>5} {cfg.patch_size:>5} {cfg.depth:>5} "
              f"{cfg.embed_dim:>5} {cfg.num_heads:>5}")
    return 0


def prepare_analysis(args: argparse.Namespace, default_out: str):
    """Device, dataset, model, output folder and the provenance of an ``analyze`` command."""
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
    config = {k: v for k, v in vars(args).items() if k not in ("command", "analysis", "debug")}
    config["num_images"] = len(dataset)
    meta = provenance(config=config, seed=args.seed, dataset=args.dataset, dataset_root=args.data_dir, device=device)
    return device, dataset, model, Path(args.out or default_out), meta


def print_files(files: dict[str, Path]) -> None:
    for kind, path in files.items():
        print(f"{kind:>10}: {path}")


def cmd_analyze_locality(args: argparse.Namespace) -> int:
    from vitscope.analyze import measure_locality, write_locality
    from vitscope.report.figures import behaviour_space, per_layer

    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-locality")
    result = measure_locality(model, dataset, batch_size=args.batch_size, device=device,
                              renormalize=args.renormalize, unit=args.unit, img_size=args.img_size)
    files = write_locality(out, result, meta)
    mad, entropy = result.stats.mad.numpy(), result.stats.entropy.numpy()
    files["figure"] = behaviour_space({args.model: (mad, entropy)}, out / "behaviour_space.png", unit=args.unit)
    files["per-layer"] = per_layer({args.model: mad}, f"MAD ({args.unit})", out / "mad_per_layer.png")
    print(f"min early-layer MAD {result.summary()['min_early_mad']:.4f} ({args.unit}) over {len(dataset)} images")
    print_files(files)
    return 0


def cmd_analyze_norms(args: argparse.Namespace) -> int:
    from vitscope.analyze.inputs import model_batches
    from vitscope.analyze.norms import measure_norms, write_norms
    from vitscope.metrics.norms import parse_threshold
    from vitscope.report.norm_figures import high_norm_maps, norm_histograms

    parse_threshold(args.threshold)  # fail before loading anything
    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-norms")
    result = measure_norms(model, dataset, threshold=args.threshold, detect_layer=args.detect_layer - 1,
                           batch_size=args.batch_size, device=device, img_size=args.img_size)
    files = write_norms(out, result, meta)
    files["histograms"] = norm_histograms([n.numpy().ravel() for n in result.norms], result.names,
                                          result.threshold.value, result.threshold.spec, out / "norm_histograms.png")
    if result.tokens["kind"] == "plain":
        grid = result.tokens["patches"]["grid"]
        count = min(16, len(dataset))
        images, _ = next(model_batches(model, dataset.subset(count), count, "cpu", args.img_size))
        shown = (images - images.amin(dim=(1, 2, 3), keepdim=True))
        shown = (shown / shown.amax(dim=(1, 2, 3), keepdim=True)).permute(0, 2, 3, 1).numpy()
        maps = result.norms[result.detect_layer][:count, result.prefix :].view(count, *grid).numpy()
        files["maps"] = high_norm_maps(shown, maps, result.threshold.value, out / "high_norm_maps.png")
    top = result.summary()[result.detect_layer]
    print(f"threshold {result.threshold.spec} = {result.threshold.value:.4g}; high-norm patch tokens at layer "
          f"{result.detect_layer + 1}: {top['high_norm_fraction']:.2%}")
    print_files(files)
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    return {"locality": cmd_analyze_locality, "norms": cmd_analyze_norms}[args.analysis](args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"models": cmd_models, "analyze": cmd_analyze, "train": cmd_train, "study": cmd_study,
                "demo": cmd_demo}
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("vitscope: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line for users, the full story with --debug
        if args.debug:
            raise
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"vitscope: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
