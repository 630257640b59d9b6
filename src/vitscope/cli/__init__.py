"""The ``vitscope`` command. Errors print one line on stderr and exit 2 (a traceback with --debug).

Each command lives in its own module of this package and exposes ``register(commands)``, which adds its
subparser and sets ``handler`` (a function of the parsed arguments returning the exit code). A new command
is one new module and one entry in ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import vitscope

COMMAND_MODULES = ("models", "analyze", "train", "study", "demo", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitscope", description=vitscope.__doc__)
    parser.add_argument("--version", action="version", version=f"vitscope {vitscope.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"vitscope.cli.{name}").register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("vitscope: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line for users, the full story with --debug
        if args.debug:
            raise
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"vitscope: error: {message}", file=sys.stderr)
        return 2
