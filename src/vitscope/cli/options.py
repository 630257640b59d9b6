"""The command-line options commands share, and their argparse types.

The shared options (``--device --batch-size --seed --out --debug``) are one table, ``SHARED_OPTIONS``. Each
command names the ones it takes, with its own defaults (``add_shared``); they may be given before or after
the command's name (``vitscope --device cpu demo`` = ``vitscope demo --device cpu``), and one given before
a command that does not take it is refused rather than ignored. ``add_common``, ``add_model_source``,
``add_model_changes`` and ``add_dataset_options`` are the model and data options of the commands that read them.
"""

from __future__ import annotations

import argparse
import math
from typing import Any


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (the error names the value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 1")
    return value


def _number(text: str, accept, wanted: str) -> float:
    """``text`` as a float that ``accept`` takes, else an ArgumentTypeError saying it must be ``wanted``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not accept(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be {wanted}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    return _number(text, lambda v: 0 < v < math.inf, "a number > 0")


def unit_fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    return _number(text, lambda v: 0 <= v <= 1, "a number in [0, 1]")


SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "device": {"metavar": "DEVICE", "help": "auto, cpu, cuda or cuda:N"},
    "batch_size": {"type": positive_int, "metavar": "N", "help": "images per batch"},
    "seed": {"type": int, "metavar": "SEED", "help": "random seed"},
    "out": {"metavar": "DIR", "help": "output folder (created if missing)"},
    "debug": {"action": "store_true", "help": "show the full traceback of an error"},
}
TOP_PREFIX = "top_"  # dests of the shared options given before the command name


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_shared(parser: argparse.ArgumentParser, decided_by: dict[str, str] | None = None, **defaults: Any) -> None:
    """Add the shared options named in ``defaults`` (name -> this command's default) to a command's parser;
    ``--debug`` is always added. An option whose default is None says in its help what decides it:
    ``decided_by[name]`` (e.g. ``{"batch_size": "the preset's"}``)."""
    defaults = {**defaults, "debug": False}
    decided_by = decided_by or {}
    for name in defaults:
        spec = dict(SHARED_OPTIONS[name])
        if spec.get("action") is None:
            shown = defaults[name] if defaults[name] is not None else decided_by.get(name)
            if shown is None:
                raise ValueError(f"{flag(name)} of `{parser.prog}` has no default: name what decides it (decided_by)")
            spec["help"] = f"{spec['help']} (default: {shown})"
        parser.add_argument(flag(name), dest=name, default=argparse.SUPPRESS, **spec)
    parser.set_defaults(shared_defaults=defaults)


def add_shared_to_top(parser: argparse.ArgumentParser) -> None:
    """The shared options accepted before the command name (they apply to the command that follows)."""
    for name, spec in SHARED_OPTIONS.items():
        spec = dict(spec)
        if spec.get("action") is None:
            spec["help"] = f"{spec['help']} (default: the command's; see `vitscope COMMAND --help`)"
        parser.add_argument(flag(name), dest=TOP_PREFIX + name, default=argparse.SUPPRESS, **spec)


def resolve_shared(args: argparse.Namespace, command: str) -> None:
    """Give each shared option its value: after the command name, else before it, else the command's
    default; an option given before a command that does not take it is a ValueError."""
    accepted = getattr(args, "shared_defaults", {"debug": False})
    for name in SHARED_OPTIONS:
        top = getattr(args, TOP_PREFIX + name, None)
        if hasattr(args, TOP_PREFIX + name):
            delattr(args, TOP_PREFIX + name)
        if name not in accepted:
            if top not in (None, False):
                raise ValueError(f"{flag(name)} does not apply to `vitscope {command}`; drop it "
                                 f"(see `vitscope {command} --help`)")
            continue
        if not hasattr(args, name):
            setattr(args, name, top if top is not None else accepted[name])
        elif name == "debug":
            args.debug = args.debug or bool(top)


DATA_DIR_HELP = ("dataset folder or archive; --dataset imagefolder reads PATH/{train,val,test}/<class>/<image>, or "
                 "PATH/<class>/<image> and a flat PATH/<image> (one class): those two are one evaluation set (every "
                 "image analysed; training and fitted probes refuse them, having no held-out split)")


def add_common(parser: argparse.ArgumentParser, default_out: str, num_images: int | None = None) -> None:
    """The options of every command that reads a model and a dataset (model, data and the shared options);
    ``default_out`` is the folder written when --out is not given, ``num_images`` the default sample size."""
    add_model_source(parser, default="vit-micro")
    parser.add_argument("--dataset", default="synthetic",
                        help="dataset name (default: synthetic, built-in scenes that need no directory)")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP + " (default: none; needed by every dataset "
                                                                        "but synthetic)")
    parser.add_argument("--num-images", type=positive_int, default=num_images,
                        help="use a seeded class-stratified sample of N images (seed: --seed)"
                             + (" (default: all images)" if num_images is None else ""))
    parser.add_argument("--download", action="store_true",
                        help="fetch what is not on disk: cifar10/cifar100 into --data-dir, and the weights a model "
                             "name asks for into the Hugging Face (or torch) cache; without it nothing is fetched")
    add_shared(parser, decided_by={"out": f"./{default_out}"}, device="auto", batch_size=128, seed=0, out=None)


IMG_SIZE_HELP = ("input side S in pixels, a multiple of the patch size: the model's position embedding is resampled "
                 "to S, and images are viewed at S x S as the model's own library views them (timm's eval "
                 "transform with its crop_pct, an hf: image processor, OpenCLIP's preprocess; a vitscope model: "
                 "shorter side resized, centre crop, images already S x S kept) (default: the model's own input "
                 "size)")
DATA_OPTIONS_HELP = ("a dataset option (several pairs may follow one --set): dataset_options.image_size=S views every "
                     "image at S x S before the model's own resize; the synthetic scenes also take num_images, "
                     "num_classes, seed, cue, ... as in `vitscope train`")


def add_dataset_options(parser: argparse.ArgumentParser) -> None:
    """``--set dataset_options.KEY=VALUE`` (read by ``vitscope.cli.analyze.resolve_data``)."""
    parser.add_argument("--set", dest="assignments", action="extend", nargs="+", default=[],
                        metavar="dataset_options.KEY=VALUE", help=DATA_OPTIONS_HELP)


def add_model_source(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--model SPEC``, ``--weights PATH`` and ``--pretrained`` (the model specs of ``vitscope.models.load``)."""
    parser.add_argument("--model", default=default, required=default is None,
                        help="preset, timm:NAME[.TAG], hf:FOLDER or hf:ORG/NAME[@REV], open_clip:ARCH[/TAG or @FILE], "
                             "or run folder / weights file" + (f" (default: {default}, random weights)" if default
                                                                else ""))
    parser.add_argument("--weights", default=None,
                        help="local weights file for the model (default: none, the model's own or random weights)")
    parser.add_argument("--pretrained", action=argparse.BooleanOptionalAction, default=None,
                        help="timm:NAME with timm's pretrained weights (its default tag) from the local cache; "
                             "--no-pretrained builds a tagged name with random weights (default: a tag means "
                             "pretrained)")


def add_model_changes(parser: argparse.ArgumentParser) -> None:
    """Options that modify a loaded model: input size, normaliser, registers."""
    parser.add_argument("--img-size", type=positive_int, default=None, metavar="S",
                        help=IMG_SIZE_HELP)
    parser.add_argument("--attention", default=None, help="swap the normaliser: softmax, sparsemax, entmax15, "
                                                          "entmax:ALPHA, entmax:learned[:ALPHA] (default: the "
                                                          "model's own)")
    parser.add_argument("--num-registers", type=int, default=0, help="add R >= 0 register tokens to a plain ViT")
    parser.add_argument("--pos-interp", choices=("timm", "original"), default=None,
                        help="how --weights' position table is interpolated to another size: as timm does, or as the "
                             "checkpoint's original repository does (default: as its origin, detected from its keys)")


def parse_seeds(seeds: str | None, seed: int | None) -> list[int]:
    """The study's seeds from ``--seeds 0,1,2`` or ``--seed N`` (not both); [0] when neither is given."""
    if seeds is not None and seed is not None:
        raise ValueError(f"--seeds {seeds} and --seed {seed} both given; use one (--seed N is --seeds N)")
    if seeds is None:
        return [0 if seed is None else seed]
    try:
        values = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {seeds!r} must be comma-separated integers, e.g. 0,1,2") from None
    repeated = sorted({s for s in values if values.count(s) > 1})
    if repeated or not values:
        raise ValueError(f"--seeds {seeds!r} must name distinct seeds (repeated: {', '.join(map(str, repeated))}); "
                         "one run is one seed, e.g. --seeds 0,1,2" if repeated else
                         f"--seeds {seeds!r} names no seed; e.g. --seeds 0,1,2")
    return values
