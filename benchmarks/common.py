"""Timing helpers shared by the benchmark scripts: medians over repeats, measured in one process."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int = 10, warmup: int = 2,
                        sync: bool = False, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per function, running them in alternation so drift and noise hit all alike. ``clock``:
    wall time by default; ``time.process_time`` gives this process's CPU time (on one thread, it is far less
    sensitive than wall time to other processes sharing the cores)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if sync:
                torch.cuda.synchronize()
            start = clock()
            fn()
            if sync:
                torch.cuda.synchronize()
            times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {torch.get_num_threads()} threads (torch {torch.__version__})"


def table(rows: list[list[str]], header: list[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
