"""Figures of token norms: per-layer histograms with the threshold, and per-image high-norm maps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from vitscope.report.figures import plt, save_figure


def norm_histograms(norms: list[np.ndarray], names: list[str], threshold: float, spec: str,
                    path: str | Path) -> Path:
    """One log-scale histogram of token norms per layer, the high-norm threshold drawn in red."""
    cols = min(4, len(norms))
    rows = math.ceil(len(norms) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, values, name in zip(axes.ravel(), norms, names, strict=False):
        values = values[values > 0]
        bins = np.logspace(np.log10(values.min()), np.log10(values.max() * 1.01), 40)
        ax.hist(values, bins=bins, color="C0")
        ax.axvline(threshold, color="red", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=8)
    for ax in axes.ravel()[len(norms):]:
        ax.axis("off")
    fig.suptitle(f"token norms per layer; red: threshold {spec} = {threshold:.3g}", fontsize=9)
    return save_figure(fig, path)


def high_norm_maps(images: np.ndarray, norm_maps: np.ndarray, threshold: float, path: str | Path) -> Path:
    """For each image (N, H, W, 3) its patch-norm map (N, gh, gw), high-norm patches outlined."""
    count = len(images)
    cols = min(8, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(2 * rows, cols, figsize=(1.6 * cols, 3.2 * rows), squeeze=False)
    for i in range(count):
        r, c = divmod(i, cols)
        axes[2 * r][c].imshow(images[i])
        axes[2 * r + 1][c].imshow(norm_maps[i], cmap="viridis")
        ys, xs = np.nonzero(norm_maps[i] > threshold)
        axes[2 * r + 1][c].scatter(xs, ys, s=14, facecolors="none", edgecolors="red", linewidths=1)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("patch-token norms (detection layer); red: high-norm", fontsize=9)
    return save_figure(fig, path)
