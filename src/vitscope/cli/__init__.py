"""The ``vitscope`` command. Errors print one line on stderr and exit 2 (a traceback with --debug); a full disk or an
unwritable cache gets a line naming the folder (``write_errors``), and a failed command removes the output folders
it created and wrote nothing into (``out_folders.created_folders``).

Each command lives in its own module of this package and exposes ``register(commands)``, which adds its
subparser and sets ``handler`` (a function of the parsed arguments returning the exit code). A new command
is one new module and one entry in ``COMMAND_MODULES``. A command takes the shared options it names with
``options.add_shared`` (``--device --batch-size --seed --out --debug``), before or after its name.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import vitscope
from vitscope.cli.options import add_shared_to_top, resolve_shared
from vitscope.cli.out_folders import check_output_dir, created_folders
from vitscope.cli.preflight import check_data_dir, check_device_flag, check_launcher_flag, quiet_torch_notices
from vitscope.cli.write_errors import write_failure_line
from vitscope.lazy_import import submodule_getattr
from vitscope.threads import apply_thread_count, apply_wait_policy

COMMAND_MODULES = ("models", "analyze", "explore", "probe", "train", "study", "demo", "doctor", "export")
SHARED_EPILOG = """shared options: --device, --batch-size, --seed, --out and --debug go before or after the command
name; each command lists in its --help the ones it takes (models: --debug only; doctor: --device, --debug;
train: all, as overrides of its config; study locality: --seed is a single --seeds)."""


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that shows every option's default: ``(default: VALUE)`` is appended unless the help already says
    what the default is (or what decides it, as options without a fixed default must)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.nargs == 0 or "default" in text.lower()
                or action.default in (None, argparse.SUPPRESS)):
            return text
        shown = "none" if action.default == [] else "%(default)s"
        return f"{text} (default: {shown})".lstrip()


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are vitscope's one line on stderr (exit 2), pointing at the help of the command that
    was given (``vitscope analyze norms --help``); the usage stays in ``--help``, which shows every default. Every
    command's parser is one too (``add_subparsers`` makes its parsers of the parent's class)."""

    is_root = False  # the ``vitscope`` parser itself; a command's parser refuses arguments it does not know

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self.is_root:  # argparse would report them from the top parser, pointing at its help
            self.error(f"unrecognized arguments: {' '.join(extras)}{self.did_you_mean(extras)}")
        return parsed, extras

    def did_you_mean(self, extras: list[str]) -> str:
        """"; did you mean --xyz?" for the first unknown flag close to one of this parser's options (a typo, or
        ``_`` for ``-``), else empty."""
        import difflib

        known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        for extra in extras:
            flag_given = extra.split("=", 1)[0]
            if flag_given.startswith("--"):
                close = difflib.get_close_matches(flag_given.replace("_", "-"), known, n=1, cutoff=0.75)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""

    def error(self, message: str):
        self.exit(2, f"vitscope: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="vitscope", description=vitscope.__doc__, epilog=SHARED_EPILOG)
    parser.is_root = True
    parser.add_argument("--version", action="version", version=f"vitscope {vitscope.__version__}")
    add_shared_to_top(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"vitscope.cli.{name}").register(commands)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, "analysis", None) or getattr(args, "study", None) or getattr(args, "probe", None)
    return f"{args.command} {sub}" if isinstance(sub, str) else args.command


def main(argv: Sequence[str] | None = None) -> int:
    try:  # before the commands import torch: OpenMP reads its wait policy when torch loads (vitscope.threads)
        apply_wait_policy()
        apply_thread_count()  # checks VITSCOPE_THREADS (and OMP_NUM_THREADS wins)
    except ValueError as err:
        print(f"vitscope: error: {one_line(err)}", file=sys.stderr)
        return 2
    quiet_torch_notices()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    args.debug = bool(getattr(args, "debug", False) or getattr(args, "top_debug", False))
    created_folders.begin()
    code = 2
    try:
        resolve_shared(args, _command_name(args))
        check_data_dir(args)
        check_device_flag(args)
        check_launcher_flag(args)
        if getattr(args, "out", None) and not getattr(args, "out_is_run_folder", False):
            # a folder, or for commands that write one file (export) its folder; train checks its run folder.
            # Only checked: the command creates it once its own options pass (output_dir)
            check_output_dir(Path(args.out).parent if getattr(args, "out_is_file", False) else args.out)
        code = args.handler(args)
        return code
    except KeyboardInterrupt:
        print("vitscope: interrupted", file=sys.stderr)
        code = 130
        return code
    except Exception as err:  # one line for users, the full story with --debug
        if args.debug:
            raise
        print(f"vitscope: error: {write_failure_line(err, args) or one_line(err)}", file=sys.stderr)
        return 2
    finally:
        if code != 0:  # a refused or failed command leaves no folder it created and wrote nothing into
            created_folders.remove_unused()


def one_line(err: BaseException) -> str:
    """The line to print for ``err``: its first line, or for an error re-raised from a DataLoader worker (torch's
    "Caught ValueError in DataLoader worker process 0." and the worker's traceback) the worker's own message."""
    lines = str(err).splitlines()
    if not lines:
        return type(err).__name__
    if lines[0].startswith("Caught ") and "worker" in lines[0] and len(lines) > 1:
        _, _, message = lines[-1].partition(": ")  # the traceback's last line: "ValueError: cannot decode ..."
        return message or lines[-1]
    return lines[0]


__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
