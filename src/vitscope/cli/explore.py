"""``vitscope explore``: an interactive attention and token explorer, one offline HTML file (docs/explore.md)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from vitscope.cli.options import add_common, add_dataset_options, add_model_changes
from vitscope.cli.out_folders import locked_out
from vitscope.cli.preflight import prepare_analysis


def register(commands) -> None:
    explore = commands.add_parser(
        "explore", help="an interactive attention and token explorer in one offline HTML file",
        description="Writes OUT/explorer.html: click a patch to see where every head attends, layer by layer, with "
                    "per-head MAD and entropy, token norms and high-norm tokens; --compare shows models side by side.")
    add_common(explore, "vitscope-explore", num_images=16)
    add_model_changes(explore)
    add_dataset_options(explore)
    explore.set_defaults(num_images=16, dataset=None)  # None: a run folder's own dataset, else synthetic
    for action in explore._actions:
        if "--dataset" in action.option_strings:
            action.help = "dataset name (default: a run folder's own dataset and options, else synthetic)"
    explore.add_argument("--compare", nargs="+", default=[], metavar="[LABEL=]SPEC[@WEIGHTS]",
                         help="more models side by side with --model (layers matched by relative depth)")
    explore.add_argument("--layers", default="all", help="attention layers to keep, 1-based: e.g. 1,2,12 (default all)")
    explore.add_argument("--heads", default="all", help="heads to keep, 1-based: e.g. 1,3 (default all)")
    explore.add_argument("--threshold", default="percentile:98",
                         help="high-norm rule: percentile:Q, absolute:T or auto")
    explore.add_argument("--detect-layer", default="last", metavar="LAYER",
                         help="token layer 1..L (or last) whose patch-token norms set the threshold")
    explore.add_argument("--max-mb", type=float, default=100.0,
                         help="size budget of the page in MB: a page estimated above it is refused before the model "
                              "runs, and 8-bit maps are coarsened to fit (default 100)")
    explore.add_argument("--rows", choices=("auto", "qk", "maps"), default="auto",
                         help="how attention rows are stored: auto (the smaller per layer), qk (queries and keys, the "
                              "page computes rows) or maps (8-bit rows) (default auto)")
    explore.set_defaults(handler=locked_out(run_explore, "vitscope-explore"))


def parse_numbers(text: str, flag: str) -> list[int] | None:
    """1-based numbers ``1,2,5`` -> 0-based indices; ``all`` -> None."""
    if text.strip().lower() == "all":
        return None
    try:
        numbers = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} must be comma-separated numbers from 1, e.g. {flag} 1,2 (or all)") from None
    if not numbers or min(numbers) < 1:
        raise ValueError(f"{flag} {text!r}: numbers start at 1 (as in reports); e.g. {flag} 1,2 (or all)")
    return [n - 1 for n in numbers]


def compare_entries(items: list[str]):
    """``[LABEL=]SPEC[@WEIGHTS]`` values -> ModelEntry list (the label defaults to the spec's last path part)."""
    from vitscope.studies.models import parse_model_entries

    texts = [item if "=" in item.split("@")[0] else f"{_label(item.split('@')[0])}={item}" for item in items]
    return parse_model_entries(texts, "--compare")


def model_label(spec: str, weights: str | None = None) -> str:
    """The page's name for ``--model SPEC [--weights FILE]``: a named spec as written (``timm:NAME``, ``hf:ORG/NAME``),
    a path by ``_label``; a weights file's name follows (``timm:vit_small_patch14_dinov2 @ dinov2s_imgfocus_timm``)."""
    named = spec.split(":", 1)[0] in ("timm", "hf", "open_clip")
    label = spec if named else _label(spec)
    return f"{label} @ {Path(weights).stem}" if weights else label


def _label(spec: str) -> str:
    """A label from a path spec: its last path part (a run's ``<condition>/seed-<n>`` keeps both), in characters a
    ``--compare LABEL=`` accepts."""
    path = Path(spec.rstrip("/"))
    name = f"{path.parent.name}-{path.name}" if path.name.startswith("seed-") and path.parent.name else path.name
    name = name or spec
    return "".join(ch if ch.isalnum() or ch in "._+-" else "-" for ch in name)


def run_explore(args: argparse.Namespace) -> int:
    from vitscope.cli.analyze import detect_layer_index, resolve_data
    from vitscope.explorer import explore
    from vitscope.metrics.norms import parse_threshold
    from vitscope.models import attention_sites, has_random_weights

    parse_threshold(args.threshold)  # fail before loading anything
    layers, heads = parse_numbers(args.layers, "--layers"), parse_numbers(args.heads, "--heads")
    detect = detect_layer_index(args.detect_layer)
    if args.max_mb <= 0:
        raise ValueError(f"--max-mb {args.max_mb} must be > 0, e.g. --max-mb 100")
    entries = compare_entries(args.compare)
    started = time.perf_counter()
    print(resolve_data(args))
    device, dataset, model, out, _ = prepare_analysis(args, "vitscope-explore")
    depth = len(attention_sites(model))
    if layers is not None and max(layers) >= depth:
        raise ValueError(f"--layers {args.layers}: {args.model} has {depth} attention layers; use numbers 1..{depth}")
    most_heads = max(int(getattr(site.module, "num_heads", 0)) for site in attention_sites(model))
    if heads is not None and most_heads and max(heads) >= most_heads:
        raise ValueError(f"--heads {args.heads}: {args.model} has at most {most_heads} heads per layer; use numbers "
                         f"1..{most_heads}")
    models = [model] + [entry.load() for entry in entries]
    changes = [c for c in (args.attention, f"reg{args.num_registers}" if args.num_registers else None) if c]
    labels = [model_label(args.model, args.weights) + "".join(f" +{c}" for c in changes)]
    labels += [entry.label for entry in entries]
    if len(set(labels)) < len(labels):
        labels = [f"{i + 1}:{label}" for i, label in enumerate(labels)]
    randoms = [has_random_weights(args.model, args.weights, args.pretrained)]
    randoms += [has_random_weights(e.spec, e.weights) for e in entries]
    labels = [label + (" (random weights)" if random else "") for label, random in zip(labels, randoms, strict=True)]
    page = explore(models, dataset, labels=labels, layers=layers, heads=heads, threshold=args.threshold,
                   detect_layer=detect, max_bytes=int(args.max_mb * 1e6), batch_size=args.batch_size, device=device,
                   title=f"vitscope explorer: {' vs '.join(labels)} on {args.dataset}", rows=args.rows)
    path = page.save(Path(out) / "explorer.html")
    print(f"explorer: {path.resolve()} ({page.size_bytes / 1e6:.1f} MB, {len(dataset)} images, "
          f"{error_summary(page.meta)}, {time.perf_counter() - started:.1f} s)")
    return 0


def error_summary(meta: dict) -> str:
    """How far the page's rows may be off: per storage form, in one clause."""
    parts = []
    precision, q = meta["precision"], meta["quantization"]
    if precision["layers"]:
        kept = f", {precision['full']} head-images in float32" if precision["full"] else ""
        parts.append(f"{precision['layers']} layers as float16 queries and keys{kept}: max error "
                     f"{100 * precision['measured']:.2g} % of a row's maximum")
    if q["layers"]:
        parts.append(f"{q['layers']} layers as 8-bit maps: max error {q['bound']:.2g}")
    return "; ".join(parts)
