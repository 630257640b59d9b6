"""``vitscope demo``: the studies' demo presets on built-in data."""

from __future__ import annotations

import argparse

from vitscope.cli.study import run_locality_study


def register(commands) -> None:
    demo = commands.add_parser("demo", help="the locality study's demo preset on built-in data (~10 min on a CPU)")
    demo.add_argument("--out", default="vitscope-demo")
    demo.add_argument("--device", default="auto")
    demo.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    report = run_locality_study(conditions=["baseline", "baseline+cutmix"], seeds=[0], preset="demo",
                                device=args.device, out=args.out)
    print(f"report: {report.resolve()}")
    return 0
