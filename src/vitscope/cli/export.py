"""``vitscope export``: write a model's weights for another library: a timm checkpoint (``--format timm``, vitscope
models) or a transformers ``save_pretrained`` folder (``--format hf``, vitscope and timm ViTs; ``hf:FOLDER`` loads it
back to the same tokens; ``vitscope.models.export.hf``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitscope.cli.options import add_model_source, add_shared, positive_int
from vitscope.cli.out_folders import output_dir


def register(commands) -> None:
    export = commands.add_parser("export", help="write a model as a timm checkpoint or a transformers folder")
    add_model_source(export)
    export.add_argument("--format", default="timm", choices=["timm", "hf"],
                        help="timm: a .safetensors file for timm (vitscope models); hf: a transformers "
                             "save_pretrained folder (Dinov2Model) that --model hf:FOLDER loads (default: timm)")
    export.add_argument("--img-size", type=positive_int, default=None,
                        help="the input side in pixels the exported position table is resampled to (hf: the "
                             "config's image_size; default: the model's own)")
    export.add_argument("--pos-interp", choices=("timm", "original"), default=None,
                        help="how --weights' position table is resampled to --img-size (default: as its origin)")
    export.add_argument("--download", action="store_true", help="fetch weights a model name asks for if not cached")
    export.add_argument("--out", required=True, help="output .safetensors file (timm) or a new folder (hf)")
    add_shared(export)  # --debug
    export.set_defaults(handler=run, out_is_file=True)


def run(args: argparse.Namespace) -> int:
    from vitscope.models import load

    model = load(args.model, weights=args.weights, img_size=args.img_size, pos_interp=args.pos_interp,
                 pretrained=args.pretrained, download=args.download)
    if args.format == "hf":
        return _run_hf(args, model)
    return _run_timm(args, model)


def _run_hf(args: argparse.Namespace, model) -> int:
    from vitscope.models.export.hf import export_hf

    output_dir(Path(args.out).parent)
    try:
        written = export_hf(model, args.out)
    except OSError as err:
        raise ValueError(f"--out {args.out} cannot be written ({err.strerror or err}); pass a new folder in a folder "
                         "you can write to") from None
    print(f"wrote {args.out}: transformers {written['class']} at {written['image_size']} px; load it with "
          f"--model hf:{args.out}")
    return 0


def _run_timm(args: argparse.Namespace, model) -> int:
    from safetensors import SafetensorError

    from vitscope.models.export.timm import export_timm

    output_dir(Path(args.out).parent)
    try:
        timm_args = export_timm(model, args.out)
    except (OSError, SafetensorError) as err:  # their messages name the temporary file beside --out
        reason = err.strerror if isinstance(err, OSError) and err.strerror else "an I/O error"
        raise ValueError(f"--out {args.out} cannot be written ({reason}); pass a .safetensors path in a folder you "
                         "can write to") from None
    print(f"wrote {args.out}; build it with "
          f"timm.models.vision_transformer.VisionTransformer(**{json.dumps(timm_args)})")
    if model.cfg.attention != "softmax":
        print(f"note: the model uses {model.cfg.attention} attention; timm will run it with softmax unless it is "
              f"loaded through vitscope.models.load('timm:NAME', weights='{args.out}', "
              f"attention='{model.cfg.attention}')")
    return 0
