"""OpenMP's wait policy, set before torch loads its OpenMP runtime (which reads it once, at load).

With OpenMP's default policy, intra-op threads spin at every barrier before they sleep. On a machine whose cores
other processes also use, a spinning thread holds a core the thread it waits for needs, and a training step
slowed by 4-6x beside one or two busy processes (``benchmarks/bench_shared_cpu.py``; docs/benchmarks.md).
``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep at once. ``import vitscope`` sets it when torch is not
yet imported and the variable is unset; ``VITSCOPE_OMP_PASSIVE=0`` keeps OpenMP's default, and an
``OMP_WAIT_POLICY`` already in the environment is left as it is.

``VITSCOPE_THREADS=auto`` (opt-in) also sets ``OMP_NUM_THREADS`` to the cores other processes leave free (at
least one), counted from the runnable tasks in /proc/loadavg at import: on a busy machine fewer threads wait
less on each other. (Not the default: results can differ in the last bits with the thread count.) An integer
sets that many threads. This module imports nothing heavy: it must run before torch.
"""

from __future__ import annotations

import os
import sys
import time

OPT_OUT = "VITSCOPE_OMP_PASSIVE"


def set_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` if torch is not loaded yet and nobody chose a policy; True if it was set."""
    if os.environ.get(OPT_OUT, "1") == "0" or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def free_cores(samples: int = 5, interval_s: float = 0.01) -> int:
    """Cores of this process's CPU set not taken by other runnable tasks (median of ``samples`` reads of
    /proc/loadavg's running count, less this process's one), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    counts = []
    try:
        for _ in range(samples):
            with open("/proc/loadavg") as handle:
                counts.append(int(handle.read().split()[3].split("/")[0]))
            time.sleep(interval_s)
    except (OSError, ValueError, IndexError):
        return cores
    others = max(0, sorted(counts)[len(counts) // 2] - 1)
    return max(1, cores - others)


def set_thread_count() -> int | None:
    """Apply ``VITSCOPE_THREADS`` (``auto`` or an integer) as ``OMP_NUM_THREADS`` before torch loads; the count
    set, or None when unset, already chosen (``OMP_NUM_THREADS``) or too late (torch imported)."""
    wanted = os.environ.get("VITSCOPE_THREADS", "").strip().lower()
    if not wanted or "OMP_NUM_THREADS" in os.environ or "torch" in sys.modules:
        return None
    if wanted == "auto":
        count = free_cores()
    elif wanted.isdigit() and int(wanted) > 0:
        count = int(wanted)
    else:
        raise ValueError(f"VITSCOPE_THREADS={wanted!r} must be 'auto' or a positive integer")
    os.environ["OMP_NUM_THREADS"] = str(count)
    return count
