"""Figures of token norms: per-layer histograms with the threshold, and per-image high-norm maps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from vitscope.report.figures.common import plt, readable_log_ticks, save_figure


def norm_histograms(norms: list[np.ndarray], names: list[str], threshold: float, spec: str,
                    path: str | Path, model: str | None = None) -> Path:
    """One log-scale histogram of token norms per layer (``names``: token layers), the high-norm threshold
    drawn in red; ``model`` names the model in the heading."""
    cols = min(4, len(norms))
    rows = math.ceil(len(norms) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.7 * rows), squeeze=False, layout="constrained")
    for ax, values, name in zip(axes.ravel(), norms, names, strict=False):
        values = values[values > 0]
        bins = np.logspace(np.log10(values.min()), np.log10(values.max() * 1.01), 40)
        ax.hist(values, bins=bins, color="C0")
        ax.axvline(threshold, color="red", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        readable_log_ticks(ax, "x")
        readable_log_ticks(ax, "y")
        ax.tick_params(which="both", labelsize=7)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("token norm", fontsize=7)
    for ax in axes.ravel()[len(norms):]:
        ax.axis("off")
    heading = f"token norms per token layer; red: threshold {spec} = {threshold:.3g}"
    fig.suptitle(f"{model}: {heading}" if model else heading, fontsize=9)
    return save_figure(fig, path)


def high_norm_maps(images: np.ndarray, norm_maps: np.ndarray, threshold: float, path: str | Path,
                   layer: int | None = None, model: str | None = None) -> Path:
    """For each image (N, H, W, 3) its patch-norm map (N, gh, gw) below it, on one colour scale with a colour
    bar, high-norm patches outlined; ``layer`` (token layer numbering) and ``model`` go in the heading."""
    count = len(images)
    cols = min(8, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(2 * rows, cols, figsize=(1.6 * cols + 0.8, 3.2 * rows + 0.3), squeeze=False,
                             layout="constrained")
    low, high = float(np.min(norm_maps)), float(np.max(norm_maps))
    shown = None
    for i in range(count):
        r, c = divmod(i, cols)
        axes[2 * r][c].imshow(images[i])
        axes[2 * r][c].set_title(f"image {i + 1}", fontsize=7)
        shown = axes[2 * r + 1][c].imshow(norm_maps[i], cmap="viridis", vmin=low, vmax=high)
        ys, xs = np.nonzero(norm_maps[i] > threshold)
        axes[2 * r + 1][c].scatter(xs, ys, s=14, facecolors="none", edgecolors="red", linewidths=1)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    for i in range(count, rows * cols):
        r, c = divmod(i, cols)
        axes[2 * r][c].axis("off")
        axes[2 * r + 1][c].axis("off")
    if shown is not None:
        fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8).set_label("patch-token norm", fontsize=7)
    where = f"token layer {layer}" if layer is not None else "detection layer"
    heading = f"patch-token norms ({where}) under each image; red: high-norm (> {threshold:.3g})"
    fig.suptitle(f"{model}: {heading}" if model else heading, fontsize=9)
    return save_figure(fig, path)
