"""What every report figure shares: matplotlib on the Agg backend (``plt``), ``save_figure`` (atomic, PNG or
SVG by suffix), the dashed grey style of reference lines, and axis tops that never zoom onto the data."""

from __future__ import annotations

from collections.abc import Sequence
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


__all__ = ["REFERENCE_STYLE", "axis_top", "integer_ticks", "layer_axis", "plt", "readable_log_ticks", "save_figure"]


CHAR_EMS = 0.6  # width of one tick-label character (digits, ".") in ems of its font size
LABEL_GAP_INCHES = 0.08  # free space between neighbouring tick labels
MAX_GAP = 0.45  # ticks that leave more than this fraction of the axis unlabelled read as a broken scale
LAID_OUT = 0.85  # the share of a subplot's box its axes keep once labels and titles are laid out


def readable_log_ticks(ax, axis: str = "x", fontsize: float = 7.0) -> None:
    """Round, plain-number labels on a log ``axis`` ("20", "300", "0.05"), at ``fontsize`` points: per decade
    1-9, 1-2-5, 1-3 or 1 (or every n-th decade), or on a narrow range round linear steps (1000, 1200, 1400), the
    set with the most labels that fit the axis without overlap and leave no more than ``MAX_GAP`` of it unlabelled
    (ties go to the per-decade sets). Minor ticks stay unlabelled. Call once the limits are set."""
    import matplotlib.ticker

    target = ax.xaxis if axis == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    box = ax.get_position()
    inches = LAID_OUT * (ax.figure.get_figwidth() * box.width if axis == "x"
                         else ax.figure.get_figheight() * box.height)
    candidates = _log_candidates(low, high) + _linear_candidates(low, high)
    fitting = [c for c in candidates if _fits(c, low, high, inches, axis, fontsize)]
    covering = [c for c in fitting if _largest_gap(c, low, high) <= MAX_GAP] or fitting
    chosen = max(covering, key=len) if covering else []  # max keeps the first of equals: decades before steps
    ax.tick_params(axis=axis, which="both", labelsize=fontsize)
    target.set_major_locator(matplotlib.ticker.FixedLocator(chosen))
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _log_candidates(low: float, high: float) -> list[list[float]]:
    """Tick sets inside [low, high]: 1-9, 1-2-5, 1-3 and 1 per decade, then every 2nd, 3rd, ... decade."""
    first, last = int(np.floor(np.log10(low))), int(np.ceil(np.log10(high)))
    found = []
    for subs in ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 5), (1, 3), (1,)):
        found.append([float(f"{s * 10.0 ** d:.12g}") for d in range(first, last + 1) for s in subs])
    for every in range(2, max(2, last - first) + 1):
        found.append([float(f"{10.0 ** d:.12g}") for d in range(first, last + 1) if d % every == 0])
    return [[t for t in ticks if low <= t <= high] for ticks in found]


def _linear_candidates(low: float, high: float) -> list[list[float]]:
    """Round linear steps (1, 2, 2.5, 5 x 10^k) inside [low, high], from fine to coarse."""
    import matplotlib.ticker

    found = []
    for bins in range(8, 1, -1):
        ticks = matplotlib.ticker.MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
        found.append([float(f"{t:.12g}") for t in ticks if low <= t <= high and t > 0])
    return found


def _fits(ticks: list[float], low: float, high: float, inches: float, axis: str, fontsize: float) -> bool:
    """Whether neighbouring labels of ``ticks`` on a log axis ``inches`` long keep ``LABEL_GAP_INCHES`` apart."""
    if len(ticks) < 2:
        return len(ticks) == 1
    where = (np.log10(ticks) - np.log10(low)) / (np.log10(high) - np.log10(low)) * inches
    em = fontsize / 72.0
    size = np.array([len(f"{t:g}") * CHAR_EMS * em if axis == "x" else 1.2 * em for t in ticks])
    return bool(np.all(np.diff(where) >= (size[:-1] + size[1:]) / 2 + LABEL_GAP_INCHES))


def _largest_gap(ticks: list[float], low: float, high: float) -> float:
    """The largest stretch of the log axis (as a fraction of it) with no tick, ends included."""
    if not ticks:
        return 1.0
    points = np.log10([low, *ticks, high])
    return float(np.max(np.diff(points)) / (points[-1] - points[0]))


def integer_ticks(axis) -> None:
    """Whole-number ticks only on ``axis`` (layers, counts), even when its range spans less than one unit (one
    layer), where matplotlib's ``integer=True`` falls back to fractions."""
    import matplotlib.ticker

    axis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True, min_n_ticks=1))


def layer_axis(ax, layers: Sequence[float]) -> None:
    """An x axis of layers: whole-number ticks only, and half a layer either side when the plot has one layer
    (matplotlib would otherwise zoom to 11.95-12.05 and label fractions)."""
    if len(layers) and max(layers) - min(layers) < 1:
        ax.set_xlim(min(layers) - 0.5, max(layers) + 0.5)
    integer_ticks(ax.xaxis)
