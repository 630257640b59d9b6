"""``vitscope analyze locality|norms``: measure a model on a dataset."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vitscope.cli.options import add_common, add_dataset_options, add_model_changes
from vitscope.cli.out_folders import locked_out, print_files
from vitscope.cli.preflight import prepare_analysis


def register(commands) -> None:
    analyze = commands.add_parser("analyze", help="measure a model on a dataset")
    kinds = analyze.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    locality = kinds.add_parser("locality", help="per-head mean attention distance and entropy")
    add_common(locality, "vitscope-locality")
    locality.add_argument("--unit", default="normalized", choices=["normalized", "patch", "pixel"],
                          help="distance unit of MAD: normalized (divided by the grid's largest patch distance), "
                               "patch (patch widths) or pixel (default: normalized)")
    locality.add_argument("--no-renormalize", dest="renormalize", action="store_false",
                          help="keep the raw patch mass of each row instead of renormalising it")
    locality.set_defaults(handler=locked_out(run_locality, "vitscope-locality"))
    norms = kinds.add_parser("norms", help="token norms per layer and high-norm (artifact) tokens")
    add_common(norms, "vitscope-norms")
    norms.add_argument("--threshold", default="percentile:98", help="percentile:Q, absolute:T or auto")
    norms.add_argument("--detect-layer", default="last", metavar="LAYER",
                       help="token layer (1..L = output of block l, or last) whose patch tokens set the threshold "
                            "(default: last)")
    norms.set_defaults(handler=locked_out(run_norms, "vitscope-norms"))
    for sub in (locality, norms):
        add_model_changes(sub)
        sub.set_defaults(dataset=None)  # None: the run's own dataset for a run folder, else synthetic
        helps = {"--dataset": "dataset name (default: a run folder's own dataset and options, else synthetic)"}
        for action in sub._actions:
            action.help = next((helps[o] for o in action.option_strings if o in helps), action.help)
        add_dataset_options(sub)


def run_config(model: str) -> dict[str, Any] | None:
    """The resolved training config of a vitscope run folder (its ``config.json``), else None."""
    saved = Path(model) / "config.json"
    if not saved.is_file():
        return None
    return json.loads(saved.read_text()).get("config")


def resolve_data(args: argparse.Namespace) -> str:
    """Fill ``args.dataset``, ``data_dir`` and ``dataset_options``: the run's own data (from its config) when
    ``--model`` is a run folder and ``--dataset`` is not given, else the named dataset (default synthetic);
    ``--set dataset_options.KEY=VALUE`` then overrides. Returns one line that says which data is used."""
    from vitscope.train.config import apply_overrides, check_dataset_options

    wrong = [a for a in args.assignments if not a.strip().startswith("dataset_options.")]
    if wrong:
        raise ValueError(f"--set {wrong[0]!r}: vitscope {args.command} takes only dataset_options.KEY=VALUE (e.g. "
                         "--set dataset_options.image_size=224, or a synthetic scenes' option such as "
                         "dataset_options.cue=texture)")
    config = run_config(args.model) if args.dataset is None else None
    source = "the run's config"
    if config is None:
        config = {"dataset": args.dataset or "synthetic", "dataset_options": {}}
        source = "--dataset" if args.dataset else "the default"
    args.dataset = config["dataset"]
    args.data_dir = args.data_dir if args.data_dir is not None else config.get("data_dir")
    options = apply_overrides({"dataset_options": dict(config.get("dataset_options") or {})}, args.assignments)
    args.dataset_options = options["dataset_options"]
    check_dataset_options(args.dataset, args.dataset_options)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(args.dataset_options.items()))
    where = f" from {args.data_dir}" if args.data_dir else ""
    return (f"data: {args.dataset}{where}, eval split" + (f", options {shown}" if shown else "")
            + f" ({source})")


def run_locality(args: argparse.Namespace) -> int:
    from vitscope.analyze import measure_locality, write_locality
    from vitscope.analyze.inputs import model_label
    from vitscope.report.figures.analysis import locality_figures

    print(resolve_data(args))
    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-locality")
    result = measure_locality(model, dataset, batch_size=args.batch_size, device=device,
                              renormalize=args.renormalize, unit=args.unit, img_size=args.img_size)
    label = model_label(args.model, args.weights, args.pretrained)
    files = write_locality(out, result, meta) | locality_figures(result, model, label, out, args.unit)
    print(f"min early-layer MAD {result.summary()['min_early_mad']:.4f} ({args.unit}) over {len(dataset)} images")
    print_files(files)
    return 0


def detect_layer_index(spec: str) -> int:
    """0-based block index of a token layer given as ``last`` or 1..L (token layer l = output of block l);
    token layer 0 (the embedding) has no block output to threshold."""
    if str(spec).strip().lower() == "last":
        return -1
    try:
        layer = int(spec)
    except ValueError:
        raise ValueError(f"--detect-layer {spec!r} must be a token layer number 1..L or 'last'") from None
    if layer < 1:
        raise ValueError(f"--detect-layer {layer}: token layers are numbered 1..L (the output of block l); layer 0 "
                         "is the embedding, which has no block norms; use 1..L or 'last'")
    return layer - 1


def run_norms(args: argparse.Namespace) -> int:
    from vitscope.analyze.inputs import model_label
    from vitscope.analyze.norms import measure_norms, threshold_meaning, write_norms
    from vitscope.metrics.norms import parse_threshold
    from vitscope.report.figures.analysis import norm_figures

    parse_threshold(args.threshold)  # fail before loading anything
    detect_block = detect_layer_index(args.detect_layer)
    print(resolve_data(args))
    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-norms")
    result = measure_norms(model, dataset, threshold=args.threshold, detect_layer=detect_block,
                           batch_size=args.batch_size, device=device, img_size=args.img_size)
    label = model_label(args.model, args.weights, args.pretrained)
    files = write_norms(out, result, meta) | norm_figures(result, model, dataset, out, args.img_size, label=label)
    top = result.summary()[result.detect_layer]
    print(f"threshold {result.threshold.spec} = {result.threshold.value:.4g} ({threshold_meaning(args.threshold)}); "
          f"patch tokens above it at layer {result.detect_layer + 1}: {top['high_norm_fraction']:.2%}")
    print(f"layer {result.detect_layer + 1}: {result.mode.describe()}")
    print_files(files)
    return 0
