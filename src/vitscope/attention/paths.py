"""Which fast paths the normalisers may take: the native CPU kernels, the ``torch.compile`` kernels, or neither
(the exact eager solvers alone).

The environment variables ``VITSCOPE_NATIVE`` and ``VITSCOPE_FUSED`` (``0`` turns a path off) are read here and
nowhere else, at each call that has no explicit setting, so a process can change them before first use.
``fast_paths(native=False)`` overrides them for a ``with`` block (per thread and per asyncio task), and
``fast_paths(kernels=NativeKernels(...))`` runs another build of the native kernels there (a test's, say)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class FastPaths:
    """``native``: the C++ CPU kernels; ``compiled``: the ``torch.compile`` kernels (GPU, or CPUs without a
    working native build). With both off, every normaliser and streamed metric runs its eager twin.
    ``kernels``: the ``native.NativeKernels`` to run, None for the process's shared build."""

    native: bool = True
    compiled: bool = True
    kernels: Any = None


def from_environment() -> FastPaths:
    """The paths the environment asks for: ``VITSCOPE_NATIVE=0`` turns the native kernels off,
    ``VITSCOPE_FUSED=0`` turns every fast path off."""
    fused = os.environ.get("VITSCOPE_FUSED", "1") != "0"
    return FastPaths(native=fused and os.environ.get("VITSCOPE_NATIVE", "1") != "0", compiled=fused)


_chosen: ContextVar[FastPaths | None] = ContextVar("vitscope_fast_paths", default=None)


def current() -> FastPaths:
    """The paths in force here: the innermost ``fast_paths`` block, else the environment's."""
    return _chosen.get() or from_environment()


@contextmanager
def fast_paths(native: bool | None = None, compiled: bool | None = None, kernels: Any = None) -> Iterator[FastPaths]:
    """Choose the fast paths inside a ``with`` block; None keeps the setting in force.

    ``with fast_paths(native=False, compiled=False): y = entmax15(x)`` runs the exact eager solver."""
    changes = {name: value for name, value in (("native", native), ("compiled", compiled), ("kernels", kernels))
               if value is not None}
    token = _chosen.set(replace(current(), **changes))
    try:
        yield _chosen.get()
    finally:
        _chosen.reset(token)
