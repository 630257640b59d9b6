"""Figures of probe results: score against token layer (one line per model and group), PCA maps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitscope.report.figures.common import layer_axis, plt, save_figure

CHANCE_STYLE = {"ls": "--", "color": "grey"}
ONE_POINT_CHANCE = {"marker": "_", "ms": 14, "mew": 1.5}  # a line through one point draws nothing: a dash does


def score_by_layer(rows: Sequence[dict[str, Any]], metric: str, path: str | Path, title: str = "") -> Path:
    """``metric`` against token layer for every (model, group, with_cls) in ``rows``; chance dashed (a dash mark
    where it has one layer). Layers on whole-number ticks (one layer included); the legend outside the axes."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    lines: dict[tuple, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("metric") == metric and r.get("value") is not None:
            key = (r["model"], r.get("group", ""), r.get("with_cls"))
            lines.setdefault(key, []).append((r["layer"], r["value"]))
    for (model, group, with_cls), points in sorted(lines.items(), key=lambda item: str(item[0])):
        points.sort()
        label = " / ".join(str(p) for p in (model, group, "with CLS" if with_cls else None) if p)
        style = {"marker": "o", "ms": 3}
        if model == "chance":
            style = CHANCE_STYLE | (ONE_POINT_CHANCE if len(points) == 1 else {})
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
    ax.set_xlabel("token layer (0 = embedding)")
    layer_axis(ax, [p[0] for points in lines.values() for p in points])
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if lines:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # off the lines
    return save_figure(fig, path)


def pca_grid(images: np.ndarray, maps: np.ndarray, path: str | Path, titles: Sequence[str] | None = None) -> Path:
    """Input images (N, H, W, 3) in [0, 1] above their PCA maps (N, gh, gw, 3) in [0, 1]; no colour bar."""
    count = len(images)
    fig, axes = plt.subplots(2, count, figsize=(1.6 * count, 3.4), squeeze=False)
    for i in range(count):
        axes[0][i].imshow(images[i])
        axes[1][i].imshow(maps[i], interpolation="nearest")
        if titles is not None:
            axes[0][i].set_title(titles[i], fontsize=7)
        for ax in (axes[0][i], axes[1][i]):
            ax.set_axis_off()
    axes[0][0].text(-0.1, 0.5, "image", transform=axes[0][0].transAxes, rotation=90, va="center", ha="right")
    axes[1][0].text(-0.1, 0.5, "PCA 1-3", transform=axes[1][0].transAxes, rotation=90, va="center", ha="right")
    return save_figure(fig, path)
