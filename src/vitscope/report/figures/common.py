"""What every report figure shares: matplotlib on the Agg backend (``plt``), ``save_figure`` (atomic, PNG or
SVG by suffix), the dashed grey style of reference lines, and axis tops that never zoom onto the data."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vitscope.atomic_io import atomic_path  # noqa: E402

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


LABEL_INCHES = 0.42  # room one log-axis tick label ("2000", "0.05") needs at 7 pt, with a gap


def readable_log_ticks(ax, axis: str = "x") -> None:
    """Plain-number labels on a log ``axis`` ("20", "300", "0.05"), as many as fit its width without overlap:
    the finest of 1-9, 1-2-5, 1-3 or 1 per decade (decades thinned by matplotlib past that) that fits; minor
    ticks stay unlabelled. Call after the data are drawn (the limits decide)."""
    import matplotlib.ticker

    target = ax.xaxis if axis == "x" else ax.yaxis
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    box = ax.get_position()
    length = ax.figure.get_figwidth() * box.width if axis == "x" else ax.figure.get_figheight() * box.height
    room = max(2, int(length * (0.8 if axis == "x" else 1.6) / LABEL_INCHES))  # vertical labels stack tighter
    chosen = matplotlib.ticker.LogLocator(base=10, subs=(1.0,), numticks=room)
    for subs in (tuple(range(1, 10)), (1.0, 2.0, 5.0), (1.0, 3.0)):
        locator = matplotlib.ticker.LogLocator(base=10, subs=subs, numticks=room * 4)
        inside = [t for t in locator.tick_values(low, high) if low <= t <= high]
        if len(inside) <= room:
            chosen = locator
            break
    target.set_major_locator(chosen)
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(matplotlib.ticker.NullFormatter())
