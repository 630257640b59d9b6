"""Keeping freed memory in the process while a loop allocates the same large arrays every step (glibc only).

By default glibc maps every block above its mmap threshold (128 KiB, growing to at most 32 MiB) on its own and
hands it back to the kernel when it is freed, so the next step's array of that size is fresh pages: one page fault
per 4 KiB, which the kernel must also zero. A dense-probe step allocates about 100 MB of such temporaries; paging
them in cost a sixth of the step on this project's 2-core machine (docs/benchmarks.md). ``freed_memory_kept``
has glibc serve those blocks from its heap and keep what is freed there for the next step; on leaving, the kept
memory is handed back (``malloc_trim``) and glibc's default limits are set again (as fixed values: glibc stops
raising its mmap threshold on its own once ``mallopt`` was called, which only means more blocks are mapped
one by one, as at start-up). Elsewhere (macOS, musl, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Iterator
from contextlib import contextmanager

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters, from glibc's malloc.h
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536  # glibc's defaults
_state = {"active": 0, "took": False}  # nesting: only the outermost context changes and restores the settings


def active() -> int:
    """How many ``freed_memory_kept`` contexts are open now (nested ones counted)."""
    return _state["active"]


def glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (which has ``mallopt`` and ``malloc_trim``); else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


@contextmanager
def freed_memory_kept() -> Iterator[bool]:
    """Within: large blocks come from glibc's heap and freed memory is kept there; yields whether that took.
    Process-wide while active (meant for the main thread's training loops)."""
    with mallopt_while(_state, ((_M_TRIM_THRESHOLD, 2**31 - 1), (_M_MMAP_MAX, 0)),
                       ((_M_MMAP_MAX, _DEFAULT_MMAP_MAX), (_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD))) as took:
        yield took


@contextmanager
def mallopt_while(state: dict, settings: tuple[tuple[int, int], ...], restore: tuple[tuple[int, int], ...],
                  allowed: bool = True) -> Iterator[bool]:
    """Within: glibc's ``mallopt`` (parameter, value) ``settings``, process-wide, set by the outermost of the nested
    contexts that share ``state`` (``{"active": 0, "took": False}``) when ``allowed``; on leaving the outermost,
    ``restore`` is set and freed memory handed back (``malloc_trim``). Yields whether the settings took."""
    if state["active"] == 0:
        libc = glibc() if allowed else None
        state["took"] = libc is not None and all(bool(libc.mallopt(parameter, value)) for parameter, value in settings)
    state["active"] += 1
    try:
        yield state["took"]
    finally:
        state["active"] -= 1
        if state["active"] == 0 and state["took"]:
            libc = glibc()
            for parameter, value in restore:
                libc.mallopt(parameter, value)
            libc.malloc_trim(0)
