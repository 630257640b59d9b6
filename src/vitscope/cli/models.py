"""``vitscope models``: list the model presets."""

from __future__ import annotations

import argparse

from vitscope.cli.options import add_shared


def register(commands) -> None:
    parser = commands.add_parser("models", help="list model presets with parameter counts")
    add_shared(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vitscope.models import PRESETS, count_parameters, create

    print(f"{'preset':<14}{'params':>12}  {'image':>5} {'patch':>5} {'depth':>5} {'width':>5} {'heads':>5}")
    for name, cfg in PRESETS.items():
        params = count_parameters(create(name))
        print(f"{name:<14}{params:>12,}  {cfg.img_size:>5} {cfg.patch_size:>5} {cfg.depth:>5} "
              f"{cfg.embed_dim:>5} {cfg.num_heads:>5}")
    return 0
