"""``vitscope export``: write a model's weights for another library (timm)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitscope.cli.common import add_shared, output_dir


def register(commands) -> None:
    export = commands.add_parser("export", help="write a vitscope model as a timm checkpoint")
    export.add_argument("--model", required=True, help="preset, run folder or vitscope .safetensors file")
    export.add_argument("--weights", default=None,
                        help="local weights file for a preset (default: none, random weights)")
    export.add_argument("--format", default="timm", choices=["timm"], help="target library (timm)")
    export.add_argument("--out", required=True, help="output .safetensors file")
    add_shared(export)  # --debug
    export.set_defaults(handler=run, out_is_file=True)


def run(args: argparse.Namespace) -> int:
    from safetensors import SafetensorError

    from vitscope.models import load
    from vitscope.models.export import export_timm

    model = load(args.model, weights=args.weights)
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
