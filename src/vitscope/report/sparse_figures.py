"""Figures of the sparse-attention study (matplotlib, Agg): per-layer curves, PCA maps, attention per head."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from vitscope.probes.pca import rgb_maps
from vitscope.report.figures import plt, save_figure


def layer_curves(curves: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]], ylabels: list[str],
                 path: str | Path, title: str = "") -> Path:
    """One panel per quantity (ylabels[i]); in each, one line per model (name -> (layers, mean, std)),
    the std over seeds shaded."""
    fig, axes = plt.subplots(1, len(ylabels), figsize=(5.2 * len(ylabels), 3.6), squeeze=False)
    for ax, ylabel in zip(axes[0], ylabels, strict=True):
        for name, (layers, mean, std) in curves.get(ylabel, {}).items():
            dashed = "(random init)" in name or name.startswith("chance")
            line = ax.plot(layers, mean, marker="o", ms=3, label=name, ls="--" if dashed else "-")[0]
            ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.15)
        if ax.lines:  # zero always on the axis, so small differences are not zoomed into effects
            low, high = ax.get_ylim()
            ax.set_ylim(min(low, 0.0), max(high, 0.0))
        attention = "attention" in ylabel or "Point-in-Box" in ylabel  # measured inside block l
        ax.set_xlabel("attention layer (block)" if attention else "token layer (0 = embedding)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
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
                    path: str | Path) -> Path:
    """One image and, per model (name -> (heads, T, T) attention of one layer), each head's CLS-to-patch
    attention on the grid; exact zeros are drawn white."""
    heads = max(m.shape[0] for m in maps.values())
    fig, axes = plt.subplots(len(maps), heads + 1, figsize=(1.4 * (heads + 1), 1.45 * len(maps)), squeeze=False)
    for r, (name, attn) in enumerate(maps.items()):
        axes[r][0].imshow(image.transpose(1, 2, 0))
        axes[r][0].set_title(name, fontsize=7)
        for h in range(attn.shape[0]):
            row = attn[h, 0, prefix:].reshape(grid)
            shown = np.ma.masked_where(row == 0, row)
            cmap = plt.get_cmap("magma").with_extremes(bad="white")
            axes[r][h + 1].imshow(shown, cmap=cmap, interpolation="nearest")
            zeros = float((row == 0).mean())
            axes[r][h + 1].set_title(f"head {h + 1}\n{zeros:.0%} zero", fontsize=6)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    return save_figure(fig, path)
