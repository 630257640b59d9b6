"""``vitscope study NAME``: run a study end to end; one module per study."""

from __future__ import annotations

from vitscope.cli.study import locality, registers, sparse
from vitscope.lazy_import import submodule_getattr


def register(commands) -> None:
    study = commands.add_parser("study", help="run a study end to end")
    studies = study.add_subparsers(dest="study", metavar="STUDY", required=True)
    for module in (locality, sparse, registers):
        module.add_parser(studies)


__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
