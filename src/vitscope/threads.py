"""OpenMP's wait policy, set before torch loads its OpenMP runtime (which reads it once, at load).

With OpenMP's default policy, intra-op threads spin at every barrier before they sleep. On a machine whose cores
other processes also use, a spinning thread holds a core the thread it waits for needs, and a training step
slowed by 4-6x beside one or two busy processes (``benchmarks/bench_shared_cpu.py``; docs/benchmarks.md).
``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep at once. ``import vitscope`` sets it when torch is not
yet imported and the variable is unset; ``VITSCOPE_OMP_PASSIVE=0`` keeps OpenMP's default, and an
``OMP_WAIT_POLICY`` already in the environment is left as it is. This module imports nothing heavy: it must
run before torch.
"""

from __future__ import annotations

import os
import sys

OPT_OUT = "VITSCOPE_OMP_PASSIVE"


def set_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` if torch is not loaded yet and nobody chose a policy; True if it was set."""
    if os.environ.get(OPT_OUT, "1") == "0" or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
