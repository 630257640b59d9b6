"""``vitscope demo [STUDY ...]``: each study's demo preset on built-in data, and an index of their reports.

``DEMOS`` is the one table of demos: a study adds itself with one line naming a function
``(out: Path, device: str, seed: int, batch_size: int | None) -> Path`` (the report it wrote). Bare
``vitscope demo`` runs every demo in the table; each writes into ``OUT/<name>/`` and ``OUT/index.html``, rewritten
as each demo finishes, links every report present, and the explorer page of the sparse demo's backbones
(``vitscope.explorer.demo``, seconds) when their runs are there.
"""

from __future__ import annotations

import argparse
import importlib
import time
from dataclasses import dataclass

from vitscope.cli.options import add_shared
from vitscope.cli.out_folders import output_dir
from vitscope.run_folder import writer_lock

DEMO_SEEDS = 2  # seeds per condition in every demo: the fewest from which the decision rule gives a verdict


def demo_seeds(seed: int) -> list[int]:
    """The seeds of a demo started with ``--seed``: ``DEMO_SEEDS`` consecutive ones from it."""
    return [seed + i for i in range(DEMO_SEEDS)]


@dataclass(frozen=True)
class Demo:
    title: str
    runner: str  # "module:function", imported only when the demo runs
    minutes: float  # on 2 idle CPU cores, two seeds per condition, measured Dec 1 (README, docs/benchmarks.md)


DEMOS: dict[str, Demo] = {
    "locality": Demo("Locality: does the training protocol make early layers attend locally? (arXiv 2605.16390)",
                     "vitscope.cli.study.locality:locality_demo", 3.5),
    "sparse": Demo("Sparse attention: does entmax-1.5 in place of softmax cure semantic diffusion? (arXiv 2605.23868)",
                   "vitscope.cli.study.sparse:sparse_demo", 2.0),
    "registers": Demo("Registers: high-norm (artifact) tokens across architectures, and what registers change "
                      "(arXiv 2603.25803)", "vitscope.cli.study.registers:registers_demo", 3.5),
}


def register(commands) -> None:
    total = sum(d.minutes for d in DEMOS.values())
    demo = commands.add_parser(
        "demo", help=f"every study's demo on built-in data, with an index.html (about {total:g} min, 2 idle cores)",
        description="Runs the named demos (default: all) on built-in synthetic data, two seeds per condition. "
                    "Minutes on 2 idle CPU cores, each stage measured idle on Dec 1 (two seeds per condition; "
                    "docs/benchmarks.md, section Demo): "
                    + ", ".join(f"{n} {d.minutes:g}" for n, d in DEMOS.items()) + ".")
    demo.add_argument("studies", nargs="*", metavar="STUDY", help=f"one or more of: {', '.join(DEMOS)} (default: all)")
    add_shared(demo, decided_by={"batch_size": "each demo's preset"}, device="auto", batch_size=None, seed=0,
               out="vitscope-demo")
    demo.set_defaults(handler=run)


def selected(names: list[str]) -> list[str]:
    """The demos to run, in table order; an unknown name is a ValueError listing the known ones."""
    unknown = [n for n in names if n not in DEMOS]
    if unknown:
        raise ValueError(f"no demo named {', '.join(unknown)}; choose from {', '.join(DEMOS)} (or none for all)")
    return [n for n in DEMOS if n in names] if names else list(DEMOS)


def run(args: argparse.Namespace) -> int:
    from vitscope.explorer.demo import explorer_demo
    from vitscope.report.index import write_index

    names = selected(args.studies)  # checked before --out is created
    out = output_dir(args.out)
    titles = {name: demo.title for name, demo in DEMOS.items()}
    with writer_lock(out, "demo folder"):
        index = write_index(out, titles)  # first, so that every report links back to it
        print(f"index: {index.resolve()} (updated as each demo finishes)")
        for name in names:
            module, function = DEMOS[name].runner.split(":")
            started = time.perf_counter()
            report = getattr(importlib.import_module(module), function)(out / name, args.device, args.seed,
                                                                          args.batch_size)
            minutes = (time.perf_counter() - started) / 60
            write_index(out, titles)  # a reader can open the first report while the next demo runs
            print(f"{name}: {report.resolve()} ({minutes:.1f} min)")
        explorer = explorer_demo(out, device=args.device)
        if explorer is not None:
            print(f"explorer: {explorer.resolve()}")
        index = write_index(out, titles)
    print(f"index: {index.resolve()}")
    return 0
