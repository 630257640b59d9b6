"""A package's submodules imported on first attribute access (PEP 562).

Every package of vitscope sets ``__getattr__ = submodule_getattr(__name__)``, so after ``import vitscope`` (which
imports nothing else: no torch, no environment read) every documented path resolves as an attribute chain, e.g.
``vitscope.models.load`` or ``vitscope.models.weights.hub``: each package is imported when first reached.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType


def submodule_getattr(package: str) -> Callable[[str], ModuleType]:
    """A module ``__getattr__`` for ``package`` that imports ``package.name`` when such a submodule exists, else
    raises the AttributeError Python would."""

    def __getattr__(name: str) -> ModuleType:
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
