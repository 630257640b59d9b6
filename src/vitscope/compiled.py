"""Small tensor functions compiled with ``torch.compile`` (C++ on CPU, Triton on GPU), each with its own eager
fallback.

``compiled(fn, **constants)`` returns the ``CompiledKernel`` for ``fn`` with Python constants baked in, made once
per distinct set of constants: each gets its own code object, hence its own compile cache, and a constant never
becomes a symbolic value (torch.compile's automatic dynamic floats gave wrong results for alpha-entmax).

On the CPU a kernel may run its first ``cpu_eager_calls`` calls eagerly: the C++ compile costs seconds that a
short job (the README's four batches) never earns back. The first compile also keeps torch's "No CUDA runtime is
found" notice, logged when inductor looks for a CUDA toolkit on a machine without a GPU, out of the output
(``quiet_cuda_notice``; the CLI installs the same filter at start).

Failures are per kernel and per call. When the compiled code fails where the eager function succeeds, that call
runs eagerly with a warning; a kernel whose compiled code has never run (it does not compile here) stays eager
until ``reset()``, and every other kernel is unaffected, so one transient error (an out-of-memory, say) switches
nothing off. Errors of the function itself are raised as they are. Nothing is remembered on disk.
"""

from __future__ import annotations

import logging
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch


class _DropCudaNotice(logging.Filter):
    """Drops torch's "No CUDA runtime is found" notice, logged whenever a CUDA toolkit is installed on a
    machine without a GPU (it means nothing to a CPU run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def quiet_cuda_notice() -> None:
    """Keep torch's "No CUDA runtime is found" notice out of the output (idempotent; other messages stay)."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _DropCudaNotice) for f in logger.filters):
        logger.addFilter(_DropCudaNotice())


class CompiledKernel:
    """``fn`` with ``constants`` bound, compiled on first call, eager where its compiled code fails.

    ``runs``: calls answered by the compiled code; ``failures``: calls where it failed; ``off``: eager only;
    ``cpu_eager_calls``: calls on CPU tensors answered eagerly before the first compile (``eager_runs`` counts
    them)."""

    def __init__(self, fn: Callable, constants: dict[str, Any], dynamic: bool | None, serial: int,
                 cpu_eager_calls: int = 0):
        def bound(*tensors):
            return fn(*tensors, **constants)

        code = bound.__code__.replace(co_name=f"vitscope_{fn.__name__}_{serial}")
        self.name = fn.__name__
        self.eager = bound
        self.fast = torch.compile(types.FunctionType(code, bound.__globals__, code.co_name, None, bound.__closure__),
                                  dynamic=dynamic)
        self.runs = 0
        self.failures = 0
        self.off = False
        self.cpu_eager_calls = cpu_eager_calls
        self.eager_runs = 0

    def __call__(self, *tensors):
        if self.off:
            return self.eager(*tensors)
        if self.runs == 0 and self.eager_runs < self.cpu_eager_calls and tensors[0].device.type == "cpu":
            self.eager_runs += 1  # a short CPU job never earns a C++ compile back
            return self.eager(*tensors)
        if self.runs == 0:
            quiet_cuda_notice()
        try:
            out = self.fast(*tensors)
        except Exception as err:
            out = self.eager(*tensors)  # the function's own errors are raised here, as they are
            self.failures += 1
            self.off = self.runs == 0  # never compiled here: stay eager; else only this call was eager
            warnings.warn(f"vitscope: compiled {self.name} failed ({type(err).__name__}: {err}); "
                          f"{'running it eagerly from now on' if self.off else 'ran this call eagerly'}",
                          stacklevel=2)
            return out
        self.runs += 1
        return out

    def reset(self) -> None:
        """Try the compiled code again at the next call (after fixing a compiler, say)."""
        self.off = False


class KernelCache:
    """The compiled kernels of a process, one per (function, dynamic, constants)."""

    def __init__(self):
        self._kernels: dict[tuple, CompiledKernel] = {}
        self._lock = threading.Lock()

    def get(self, fn: Callable, *, dynamic: bool | None = None, cpu_eager_calls: int = 0,
            **constants: Any) -> CompiledKernel:
        """The kernel of ``fn`` with ``constants``, made at the first request (``cpu_eager_calls`` is set then)."""
        key = (fn, dynamic, tuple(sorted(constants.items())))
        with self._lock:
            if key not in self._kernels:
                self._kernels[key] = CompiledKernel(fn, constants, dynamic, len(self._kernels), cpu_eager_calls)
            return self._kernels[key]

    def kernels(self, fn: Callable | None = None) -> list[CompiledKernel]:
        """Every kernel made so far (of ``fn`` only, if given)."""
        with self._lock:
            return [k for key, k in self._kernels.items() if fn is None or key[0] is fn]


_cache = KernelCache()


def kernel_cache() -> KernelCache:
    """The process's shared kernel cache."""
    return _cache


def compiled(fn: Callable, *, dynamic: bool | None = None, cpu_eager_calls: int = 0,
             **constants: Any) -> CompiledKernel:
    """The shared ``CompiledKernel`` of ``fn`` with ``constants`` bound; see the module docstring."""
    return _cache.get(fn, dynamic=dynamic, cpu_eager_calls=cpu_eager_calls, **constants)
