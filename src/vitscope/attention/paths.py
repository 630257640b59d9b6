"""Which fast paths the normalisers may take: the native CPU kernels, the ``torch.compile`` kernels, or neither
(the exact eager solvers alone).

The environment variables ``VITSCOPE_NATIVE`` and ``VITSCOPE_FUSED`` (``0`` turns a path off) are read here and
nowhere else, at each call that has no explicit setting, so a process can change them before first use.
``fast_paths(native=False)`` overrides them for a ``with`` block (per thread and per asyncio task), and
``fast_paths(kernels=NativeKernels(...))`` runs another build of the native kernels there (a test's, say).
``deferred_exactness(device)`` is the training loops' block: on CUDA the compiled kernels' rows that are not
proven exact are counted on the device (``exactness.py``) instead of finished at once, so a step never waits
for the host; ``VITSCOPE_DEFERRED_CHECK`` (``0`` never, ``1`` on every device, unset: CUDA only) overrides it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import torch


@dataclass(frozen=True)
class FastPaths:
    """``native``: the C++ CPU kernels; ``compiled``: the ``torch.compile`` kernels (GPU, or CPUs without a
    working native build). With both off, every normaliser and streamed metric runs its eager twin.
    ``kernels``: the ``native.NativeKernels`` to run, None for the process's shared build.
    ``deferred_check``: rows the compiled kernels cannot prove exact are counted (``exactness.py``), not
    finished by the exact solver, so that no call reads a device value on the host."""

    native: bool = True
    compiled: bool = True
    kernels: Any = None
    deferred_check: bool = False


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
def fast_paths(native: bool | None = None, compiled: bool | None = None, kernels: Any = None,
               deferred_check: bool | None = None) -> Iterator[FastPaths]:
    """Choose the fast paths inside a ``with`` block; None keeps the setting in force.

    ``with fast_paths(native=False, compiled=False): y = entmax15(x)`` runs the exact eager solver."""
    changes = {name: value for name, value in (("native", native), ("compiled", compiled), ("kernels", kernels),
                                               ("deferred_check", deferred_check)) if value is not None}
    token = _chosen.set(replace(current(), **changes))
    try:
        yield _chosen.get()
    finally:
        _chosen.reset(token)


def deferred_exactness(device: torch.device | str):
    """The block a training step runs in: ``fast_paths(deferred_check=True)`` on CUDA (or wherever
    ``VITSCOPE_DEFERRED_CHECK=1``), nothing elsewhere or with ``VITSCOPE_DEFERRED_CHECK=0``. The caller reads
    the count with ``exactness.take_unproven()`` at its log cadence."""
    setting = os.environ.get("VITSCOPE_DEFERRED_CHECK", "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"VITSCOPE_DEFERRED_CHECK={setting!r}; set 0 (finish every row at once), 1 (always defer) "
                         "or leave it unset (defer on CUDA)")
    if setting == "1" or (setting == "" and torch.device(device).type == "cuda"):
        return fast_paths(deferred_check=True)
    return nullcontext(current())
