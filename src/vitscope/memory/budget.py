"""How much memory a job may use, and how much this process uses.

A job that measures a model (``vitscope analyze``, the registers census, feature extraction) plans its batches in a
``MemoryBudget``: by default what the process holds now plus half of the memory the system has available
(``MemAvailable`` in /proc/meminfo: free memory plus caches it can drop), so that a shared machine keeps room; it
refuses only work that would not fit in what the process holds plus 90 % of the available memory. Setting
``VITSCOPE_MEMORY_BUDGET`` (e.g. ``12G``, ``800M``) makes that the most the process may hold at its peak, for both.
On a CUDA device the same rules apply to the device's memory (``torch.cuda.mem_get_info``). Sizes are in bytes;
``G`` and ``M`` are binary (GiB, MiB), as the kernel counts memory.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from dataclasses import dataclass

BUDGET_VARIABLE = "VITSCOPE_MEMORY_BUDGET"
PLAN_SHARE, REFUSE_SHARE = 0.5, 0.9  # of the available memory: what batches are planned in, what is refused beyond
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str, name: str = BUDGET_VARIABLE) -> int:
    """Bytes from ``12G``, ``12 GiB``, ``1.5GB``, ``800M`` or a plain number of bytes (binary units); a ValueError
    naming ``name``, the value and the accepted forms otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", str(text), flags=re.IGNORECASE)
    value = float(match.group(1)) * _UNITS[match.group(2).upper()] if match else 0.0
    if value < 1:
        raise ValueError(f"{name}={text!r} is not a memory size; write e.g. 12G, 800M or a number of bytes")
    return int(value)


def gigabytes(size: float) -> str:
    """``size`` bytes as GB (binary, one decimal; MB below 1 GB, two significant digits below 10 MB), for messages:
    '4.4 GB', '310 MB', '0.38 MB' (a tiny model's per-image share read '0 MB')."""
    if size >= 2**30:
        return f"{size / 2**30:.1f} GB"
    return f"{size / 2**20:.0f} MB" if size >= 10 * 2**20 else f"{size / 2**20:.2g} MB"


def available_memory() -> int | None:
    """Bytes the system can give new allocations without swapping: ``MemAvailable`` (Linux), else the free
    physical pages (``sysconf``, less than what could be freed), else None."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def peak_rss() -> int:
    """Bytes: the largest resident set this process has had (``getrusage``'s maxrss)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def process_rss() -> int:
    """Bytes this process holds in memory now (/proc/self/statm), else its peak so far."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss()


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes a job may reach at its peak: ``plan`` (batches are chosen within it) and ``limit`` (work whose
    estimate exceeds it is refused), ``in_use`` now, and ``source``, the words a message shows for where they
    came from."""

    plan: int
    limit: int
    in_use: int
    source: str


def _device_memory(device) -> tuple[int, int | None, str]:
    """(in use, available, where) for ``device``: this process's RSS and the system's available memory on the
    CPU; the allocated and free memory of a CUDA device."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return torch.cuda.memory_allocated(device), free, f"{device} memory"
    return process_rss(), available_memory(), "memory"


def memory_budget(device: object = "cpu") -> MemoryBudget | None:
    """The budget of a job on ``device`` (module docstring); None where the available memory cannot be read and
    no ``VITSCOPE_MEMORY_BUDGET`` is set (then batches are not planned)."""
    in_use, available, where = _device_memory(device)
    given = os.environ.get(BUDGET_VARIABLE, "").strip()
    if given:
        size = parse_size(given)
        return MemoryBudget(size, size, in_use, f"{BUDGET_VARIABLE}={given}")
    if available is None:
        return None
    return MemoryBudget(in_use + int(PLAN_SHARE * available), in_use + int(REFUSE_SHARE * available), in_use,
                        f"{gigabytes(in_use)} in use and {gigabytes(available)} {where} available")
