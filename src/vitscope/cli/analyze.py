"""``vitscope analyze locality|norms``: measure a model on a dataset."""

from __future__ import annotations

import argparse

from vitscope.cli.common import add_common, add_model_changes, prepare_analysis, print_files


def register(commands) -> None:
    analyze = commands.add_parser("analyze", help="measure a model on a dataset")
    kinds = analyze.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    locality = kinds.add_parser("locality", help="per-head mean attention distance and entropy")
    add_common(locality)
    locality.add_argument("--unit", default="normalized", choices=["normalized", "patch", "pixel"])
    locality.add_argument("--no-renormalize", dest="renormalize", action="store_false",
                          help="keep the raw patch mass of each row instead of renormalising it")
    locality.set_defaults(handler=run_locality)
    norms = kinds.add_parser("norms", help="token norms per layer and high-norm (artifact) tokens")
    add_common(norms)
    norms.add_argument("--threshold", default="percentile:98", help="percentile:Q, absolute:T or auto")
    norms.add_argument("--detect-layer", type=int, default=0,
                       help="layer (numbered from 1) whose patch tokens set the threshold; 0 = the last")
    norms.set_defaults(handler=run_norms)
    for sub in (locality, norms):
        add_model_changes(sub)


def run_locality(args: argparse.Namespace) -> int:
    from vitscope.analyze import measure_locality, write_locality
    from vitscope.report.analysis_figures import locality_figures

    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-locality")
    result = measure_locality(model, dataset, batch_size=args.batch_size, device=device,
                              renormalize=args.renormalize, unit=args.unit, img_size=args.img_size)
    files = write_locality(out, result, meta) | locality_figures(result, args.model, out, args.unit)
    print(f"min early-layer MAD {result.summary()['min_early_mad']:.4f} ({args.unit}) over {len(dataset)} images")
    print_files(files)
    return 0


def run_norms(args: argparse.Namespace) -> int:
    from vitscope.analyze.norms import measure_norms, write_norms
    from vitscope.metrics.norms import parse_threshold
    from vitscope.report.analysis_figures import norm_figures

    parse_threshold(args.threshold)  # fail before loading anything
    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-norms")
    result = measure_norms(model, dataset, threshold=args.threshold, detect_layer=args.detect_layer - 1,
                           batch_size=args.batch_size, device=device, img_size=args.img_size)
    files = write_norms(out, result, meta) | norm_figures(result, model, dataset, out, args.img_size)
    top = result.summary()[result.detect_layer]
    print(f"threshold {result.threshold.spec} = {result.threshold.value:.4g}; high-norm patch tokens at layer "
          f"{result.detect_layer + 1}: {top['high_norm_fraction']:.2%}")
    print_files(files)
    return 0
