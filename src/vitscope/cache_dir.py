"""Where vitscope keeps what it can rebuild: decoded datasets, native kernels, feature caches."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where vitscope keeps what it can rebuild (decoded datasets, native kernels): ``$VITSCOPE_CACHE``, else
    ``~/.cache/vitscope``."""
    return Path(os.environ.get("VITSCOPE_CACHE", Path.home() / ".cache" / "vitscope"))
