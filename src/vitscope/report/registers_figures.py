"""Figures of the registers study: log-scale norm histograms, high-norm fraction per layer, CLS attention maps."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.ticker
import numpy as np

from vitscope.report.figures import plt, save_figure

GROUP_COLOURS = {"patch": "C0", "cls": "C3", "register": "C2"}


def norm_histograms(histograms: dict[str, Any], thresholds: list[dict[str, Any]], title: str, path: str | Path,
                    max_panels: int = 6) -> Path:
    """Token-norm histograms of one model on log-log axes, one panel per token layer (evenly chosen, the last
    included), patch, CLS and register tokens in their own colours; every threshold drawn as a vertical line."""
    edges = np.asarray(histograms["edges"])
    layers = sorted({int(k) for counts in histograms["counts"].values() for k in counts})
    picks = sorted({layers[int(round(i))] for i in np.linspace(0, len(layers) - 1, min(max_panels, len(layers)))})
    fig, axes = plt.subplots(1, len(picks), figsize=(2.6 * len(picks), 2.6), squeeze=False, sharey=True)
    centres = np.sqrt(edges[:-1] * edges[1:])
    for ax, layer in zip(axes[0], picks, strict=True):
        for group, counts in histograms["counts"].items():
            if str(layer) in counts and sum(counts[str(layer)]):
                values = np.asarray(counts[str(layer)], dtype=float)
                ax.step(centres, np.where(values > 0, values, np.nan), where="mid", color=GROUP_COLOURS[group],
                        label=group, lw=1)
        for i, t in enumerate(thresholds):
            if t.get("stage") is None and np.isfinite(t["value"]) and edges[0] <= t["value"] <= edges[-1]:
                ax.axvline(t["value"], color="k", ls=("-", "--", ":")[i % 3], lw=0.8, label=t["spec"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(bottom=0.7)
        ax.set_title(f"layer {layer}", fontsize=8)
        ax.set_xlabel("token norm", fontsize=7)
    axes[0][0].set_ylabel("tokens")
    axes[0][-1].legend(fontsize=6, loc="upper right")
    fig.suptitle(title, fontsize=9, y=1.04)
    return save_figure(fig, path)


def high_norm_fraction(curves: Mapping[str, Mapping[str, list[tuple[int, float]]]], path: str | Path) -> Path:
    """High-norm fraction of patch tokens per layer: one panel per threshold mode, one line per model
    (``curves[spec][model] = [(layer, fraction), ...]``)."""
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4), squeeze=False)
    for ax, (spec, models) in zip(axes[0], curves.items(), strict=True):
        for model, points in models.items():
            if points:
                layers, values = zip(*points, strict=True)
                ax.plot(layers, values, marker="o", ms=3, label=model)
        ax.set_title(f"threshold {spec}", fontsize=9)
        ax.set_xlabel("token layer (block for Swin / PVT-v2)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("high-norm fraction of patch tokens")
    axes[0][-1].legend(fontsize=6)
    return save_figure(fig, path)


def cls_attention(images: np.ndarray, panels: Mapping[str, tuple[np.ndarray, tuple[int, int], int]],
                  path: str | Path, count: int = 6) -> Path:
    """The images (top row, (N, H, W, 3)) and, per model (one row each), their CLS attention of the last layer
    on the patch grid, heads averaged, on one shared colour scale with a colour bar; each map's title gives
    the mass CLS puts on register tokens. ``panels[label] = (cls rows (N, T), grid, prefix)``."""
    count = min(count, len(images), *(len(p[0]) for p in panels.values()))
    vmax = max(float(rows[:count, prefix:].max()) for rows, _, prefix in panels.values())
    fig, axes = plt.subplots(len(panels) + 1, count, figsize=(1.6 * count, 1.7 * (len(panels) + 1)), squeeze=False)
    for i in range(count):
        axes[0][i].imshow(images[i])
        axes[0][i].set_title(f"image {i + 1}", fontsize=7)
    shown = None
    for row, (label, (rows, grid, prefix)) in enumerate(panels.items(), 1):
        for i in range(count):
            shown = axes[row][i].imshow(rows[i, prefix:].reshape(grid), cmap="magma", vmin=0, vmax=vmax)
            registers = f"; on registers {float(rows[i, 1:prefix].sum()):.2f}" if prefix > 1 else ""
            axes[row][i].set_title(f"{label}{registers}", fontsize=6)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8, label="CLS attention (last layer, heads averaged)")
    return save_figure(fig, path)
