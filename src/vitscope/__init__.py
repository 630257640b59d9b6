"""vitscope: train, modify and measure how tokens interact inside Vision Transformers.

Importing has no side effects (no environment variables, threads or torch): the public names below and the
sub-packages (``vitscope.models.load``, ``vitscope.data.load_dataset`` ...) load their modules, and torch, on first
use (``vitscope.lazy_import``). The CPU wait policy and thread count are applied where runs start
(``vitscope.threads``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitscope.lazy_import import submodule_getattr
from vitscope.version import __version__

if TYPE_CHECKING:
    from vitscope.metrics import AttentionStats
    from vitscope.record import record_attention, record_tokens

_LAZY = {"AttentionStats": "vitscope.metrics", "record_attention": "vitscope.record",
         "record_tokens": "vitscope.record"}
_submodule = submodule_getattr(__name__)


def __getattr__(name: str) -> Any:
    """``vitscope.record_attention`` and friends, and the sub-packages (``vitscope.models``, ``vitscope.data`` ...),
    imported on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    return _submodule(name)


def explore(*args, **kwargs):
    """The interactive attention and token explorer page (``vitscope.explorer.explore``; docs/explore.md)."""
    from vitscope.explorer import explore as build_explorer

    return build_explorer(*args, **kwargs)


__all__ = ["AttentionStats", "__version__", "explore", "record_attention", "record_tokens"]
