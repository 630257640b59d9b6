"""What every report figure shares: matplotlib on the Agg backend (``plt``), ``save_figure`` (atomic, PNG or
SVG by suffix), the dashed grey style of reference lines, and axis tops that never zoom onto the data."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vitscope.files import atomic_path  # noqa: E402

REFERENCE_STYLE = {"color": "grey", "ls": "--", "lw": 1}


def axis_top(values: np.ndarray, reference: float | None, floor: float = 0.0) -> float:
    """Axis top: the data and the reference with a margin (never zoomed onto the data's spread)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    top = max(floor, float(finite.max(initial=0.0)), reference or 0.0)
    return top * 1.1 if top > 0 else 1.0


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` atomically and close it."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Path(path)


__all__ = ["REFERENCE_STYLE", "axis_top", "plt", "save_figure"]
