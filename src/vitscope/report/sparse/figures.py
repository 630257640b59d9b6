"""Figures of the sparse-attention study (matplotlib, Agg): per-layer curves, PCA maps, attention per head."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.ticker
import numpy as np
import torch

from vitscope.probes.pca import rgb_maps
from vitscope.report.figures.common import plt, save_figure

# suffixes that name a variant of a model (same colour, another line style), longest first
VARIANTS = {" (random init)": "--", " (patches + CLS)": ":", " (patches)": "-"}
ZERO_COLOUR = "#00c8ff"  # exact zeros in attention maps: a colour no value of the colour map takes


def model_of(name: str) -> str:
    """The model a curve belongs to: ``name`` without its variant suffixes."""
    for suffix in VARIANTS:
        name = name.replace(suffix, "")
    return name


def model_colours(names: list[str]) -> dict[str, str]:
    """One colour per model (variants share it), in order of first appearance; chance is grey."""
    colours: dict[str, str] = {}
    for name in names:
        model = model_of(name)
        if model not in colours:
            colours[model] = "grey" if model.startswith("chance") else f"C{sum(c != 'grey' for c in colours.values())}"
    return colours


def _style(name: str) -> str:
    if name.startswith("chance"):
        return "-."
    return next((ls for suffix, ls in VARIANTS.items() if suffix in name), "-")


def _value_limits(entries) -> tuple[float, float]:
    """y limits for (layers, mean, std) entries: zero always on the axis (small differences are not zoomed into
    effects), and every mean +- std inside with a margin of 8 % of the range, so that no line sits on the frame."""
    values = np.concatenate([np.concatenate([np.asarray(m) - np.asarray(s), np.asarray(m) + np.asarray(s)])
                             for _, m, s in entries])
    values = values[np.isfinite(values)]
    low, high = min(float(values.min(initial=0.0)), 0.0), max(float(values.max(initial=0.0)), 0.0)
    pad = 0.08 * (high - low) or 0.05
    return (low - pad if low < 0 else 0.0), high + pad


def layer_curves(curves: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]], ylabels: list[str],
                 path: str | Path, title: str = "") -> Path:
    """One panel per quantity (ylabels[i]); in each, one line per model (name -> (layers, mean, std)), the std
    over seeds shaded. A model has one colour in every panel (its random-init twin dashed, chance grey); layers
    sit on integer ticks; one legend for the figure, outside the panels, so that it covers no line."""
    colours = model_colours([name for ylabel in ylabels for name in curves.get(ylabel, {})])
    fig, axes = plt.subplots(1, len(ylabels), figsize=(4.6 * len(ylabels) + 2.2, 3.6), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, ylabel in zip(axes[0], ylabels, strict=True):
        for name, (layers, mean, std) in curves.get(ylabel, {}).items():
            line = ax.plot(layers, mean, marker="o", ms=3, label=name, ls=_style(name),
                           color=colours[model_of(name)])[0]
            ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.15)
            handles.setdefault(name, line)
        if ax.lines:
            ax.set_ylim(*_value_limits(curves[ylabel].values()))
        attention = "attention" in ylabel or "Point-in-Box" in ylabel  # measured inside block l
        ax.set_xlabel("attention layer (block)" if attention else "token layer (0 = embedding)")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.set_title(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
    if handles:
        fig.legend(list(handles.values()), list(handles), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95),
                   title="shaded: std over seeds", title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def pca_rgb(patches: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """One image's patch tokens (P, D) as an RGB map (rows, cols, 3) of their first three principal components
    (``vitscope.probes.pca``, fitted on this image alone)."""
    maps, _ = rgb_maps(torch.as_tensor(patches, dtype=torch.float32)[None], tuple(grid))
    return maps[0].numpy()


def pca_maps(images: np.ndarray, patches: Mapping[str, np.ndarray], grid: tuple[int, int], path: str | Path) -> Path:
    """Images (B, 3, H, W) uint8 on the first row, then one row per model (name -> (B, P, D) last-layer patch
    tokens) with each image's PCA map (fitted per image)."""
    count = len(images)
    rows = 1 + len(patches)
    fig, axes = plt.subplots(rows, count, figsize=(1.6 * count, 1.6 * rows), squeeze=False)
    for i in range(count):
        axes[0][i].imshow(images[i].transpose(1, 2, 0))
        for r, (name, tokens) in enumerate(patches.items(), 1):
            axes[r][i].imshow(pca_rgb(tokens[i], grid), interpolation="nearest")
            if i == 0:
                axes[r][0].set_ylabel(name, fontsize=7)
    axes[0][0].set_ylabel("image", fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    return save_figure(fig, path)


def attention_heads(image: np.ndarray, maps: Mapping[str, np.ndarray], grid: tuple[int, int], prefix: int,
                    path: str | Path, layer: str = "") -> Path:
    """One image and, per model (name -> (heads, T, T) attention of one layer), each head's CLS-to-patch
    attention on the grid, on one colour scale with a colour bar; exact zeros are drawn in ``ZERO_COLOUR``
    (a colour the map never takes), so that a zero never reads as a faint value."""
    heads = max(m.shape[0] for m in maps.values())
    fig, axes = plt.subplots(len(maps), heads + 1, figsize=(1.4 * (heads + 1) + 1.0, 1.5 * len(maps) + 0.5),
                             squeeze=False)
    top = max(float(np.max(attn[:, 0, prefix:])) for attn in maps.values())
    cmap = plt.get_cmap("magma").with_extremes(bad=ZERO_COLOUR)
    shown = None
    for r, (name, attn) in enumerate(maps.items()):
        axes[r][0].imshow(image.transpose(1, 2, 0))
        axes[r][0].set_title(name, fontsize=7)
        for h in range(attn.shape[0]):
            row = attn[h, 0, prefix:].reshape(grid)
            shown = axes[r][h + 1].imshow(np.ma.masked_where(row == 0, row), cmap=cmap, interpolation="nearest",
                                          vmin=0.0, vmax=top)
            zeros = float((row == 0).mean())
            axes[r][h + 1].set_title(f"head {h + 1}\n{zeros:.0%} zero", fontsize=6)
        for h in range(attn.shape[0], heads):
            axes[r][h + 1].axis("off")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    if shown is not None:
        bar = fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.85, pad=0.02)
        bar.set_label("CLS attention probability", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    fig.suptitle(f"CLS attention per head{', ' + layer if layer else ''}; cyan: exactly zero", fontsize=8)
    return save_figure(fig, path)
