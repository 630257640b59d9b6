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
    norms.add_argument("--detect-layer", default="last", metavar="LAYER",
                       help="token layer (1..L = output of block l, or last) whose patch tokens set the threshold "
                            "(default: last)")
    norms.set_defaults(handler=run_norms)
    for sub in (locality, norms):
        add_model_changes(sub)


def run_locality(args: argparse.Namespace) -> int:
    from vitscope.analyze import measure_locality, write_locality
    from vitscope.report.figures import behaviour_space, per_layer

    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-locality")
    result = measure_locality(model, dataset, batch_size=args.batch_size, device=device,
                              renormalize=args.renormalize, unit=args.unit, img_size=args.img_size)
    files = write_locality(out, result, meta)
    mad, entropy = result.stats.mad.numpy(), result.stats.entropy.numpy()
    uniform = plain_uniform_mad(model, args.unit)
    files["figure"] = behaviour_space({args.model: (mad, entropy)}, out / "behaviour_space.png", unit=args.unit,
                                      uniform=uniform)
    files["per-layer"] = per_layer({args.model: mad}, f"MAD ({args.unit})", out / "mad_per_layer.png",
                                   reference=uniform)
    print(f"min early-layer MAD {result.summary()['min_early_mad']:.4f} ({args.unit}) over {len(dataset)} images")
    print_files(files)
    return 0


def plain_uniform_mad(model, unit: str) -> float | None:
    """The uniform-attention MAD of a plain ViT's grid in ``unit``; None for hierarchical models (one grid per
    stage), whose figures then show the entropy reference only."""
    from vitscope.models import token_layout
    from vitscope.report.figures import uniform_mad

    try:
        layout = token_layout(model)
    except (ValueError, AttributeError):
        return None
    return uniform_mad(layout.grid_size, unit, layout.patch_size)


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
    from vitscope.analyze.inputs import model_batches
    from vitscope.analyze.norms import measure_norms, write_norms
    from vitscope.metrics.norms import parse_threshold
    from vitscope.report.norm_figures import high_norm_maps, norm_histograms

    parse_threshold(args.threshold)  # fail before loading anything
    detect_block = detect_layer_index(args.detect_layer)
    device, dataset, model, out, meta = prepare_analysis(args, "vitscope-norms")
    result = measure_norms(model, dataset, threshold=args.threshold, detect_layer=detect_block,
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
