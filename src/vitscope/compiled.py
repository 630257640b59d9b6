"""Small tensor functions compiled with ``torch.compile`` (C++ on CPU, Triton on GPU), with an eager fallback.

``compiled(fn, **constants)`` returns ``fn`` with Python constants baked in, compiled once per distinct set
of constants: each gets its own code object, hence its own compile cache, and a constant never becomes a
symbolic value (torch.compile's automatic dynamic floats gave wrong results for alpha-entmax). If compiling
or running the compiled code fails where the eager function succeeds (no C++ compiler, say), a warning says so
once and every kernel runs eagerly from then on; errors of the function itself are raised as they are.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

_cache: dict[tuple, _Compiled] = {}
_broken = False


class _Compiled:
    def __init__(self, fn: Callable, constants: dict[str, Any], dynamic: bool | None):
        def bound(*tensors):
            return fn(*tensors, **constants)

        code = bound.__code__.replace(co_name=f"vitscope_{fn.__name__}_{len(_cache)}")
        self.name = fn.__name__
        self.eager = bound
        self.fast = torch.compile(types.FunctionType(code, bound.__globals__, code.co_name, None, bound.__closure__),
                                  dynamic=dynamic)
        self.ran = False  # the compiled code has run at least once

    def __call__(self, *tensors):
        global _broken
        if not _broken:
            try:
                out = self.fast(*tensors)
                self.ran = True
                return out
            except Exception as err:
                out = self.eager(*tensors)  # the function's own errors are raised here, as they are
                _broken = True
                warnings.warn(f"vitscope: torch.compile failed ({type(err).__name__}: {err}); running eagerly",
                              stacklevel=2)
                return out
        return self.eager(*tensors)


def compiled(fn: Callable, *, dynamic: bool | None = None, **constants: Any) -> Callable:
    """``fn`` with ``constants`` bound, compiled on first call; see the module docstring."""
    key = (fn, dynamic, tuple(sorted(constants.items())))
    if key not in _cache:
        _cache[key] = _Compiled(fn, constants, dynamic)
    return _cache[key]


def compiled_and_run() -> list[str]:
    """Names of the functions whose compiled code has run in this process."""
    return sorted({kernel.name for kernel in _cache.values() if kernel.ran})
