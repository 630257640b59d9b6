"""Handing large freed blocks back at once while a measurement's temporaries vary in size (glibc only).

glibc maps a block above its mmap threshold on its own and unmaps it when it is freed, but every such free raises
the threshold (up to 32 MiB), after which blocks of that size come from its heap, where freed ones stay behind as
holes that later tensors of other sizes only partly fill. A ViT's forward pass allocates tokens x width tensors of
several sizes per batch (22 MB each for ViT-L/14 at 518 px and 4 images), so the heap ends up holding more than the
live tensors: 1.44 GB at the peak against 1.28 GB for ViT-B/14 at 518 px on 4 images, measured before this context
existed (docs/benchmarks.md, "Scale", has the peaks with it). ``freed_memory_returned`` fixes the threshold at 4
MiB: every block from 4 MiB up is mapped on its own and returned when freed, so the peak is the live set that
``vitscope.memory.estimate`` estimates; the page faults of mapping them afresh are a small cost beside the
arithmetic of such a forward pass. On leaving, glibc's start-up values are set again (as fixed values, as
``freed_memory_kept`` does). Inside ``freed_memory_kept``, whose loops want the opposite, off glibc, and where the
environment sets glibc's mmap threshold itself (``MALLOC_MMAP_THRESHOLD_`` or ``glibc.malloc.mmap_threshold`` in
``GLIBC_TUNABLES``: that choice stands), it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from vitscope.memory import kept

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
_DEFAULT_MMAP_THRESHOLD = 128 * 1024  # glibc's start-up value
THRESHOLD = 4 * 2**20  # blocks from 4 MiB up are mapped on their own within the context
_state = {"active": 0, "took": False}  # nesting: only the outermost context changes and restores the settings


def _threshold_set_by_environment() -> bool:
    """Whether glibc's mmap threshold was set for this process by its environment."""
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc.mmap_threshold" in os.environ.get(
        "GLIBC_TUNABLES", "")


@contextmanager
def freed_memory_returned() -> Iterator[bool]:
    """Within: blocks of 4 MiB and more are mapped on their own and returned when freed; yields whether that took.
    Process-wide while active."""
    allowed = kept.active() == 0 and not _threshold_set_by_environment()
    with kept.mallopt_while(_state, ((_M_MMAP_THRESHOLD, THRESHOLD), (_M_TRIM_THRESHOLD, 2 * THRESHOLD)),
                            ((_M_MMAP_THRESHOLD, _DEFAULT_MMAP_THRESHOLD),
                             (_M_TRIM_THRESHOLD, kept._DEFAULT_TRIM_THRESHOLD)), allowed) as took:
        yield took
