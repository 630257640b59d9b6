"""Figures of the registers study: log-scale norm histograms, high-norm fraction per layer, CLS attention maps."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.ticker
import numpy as np

from vitscope.report.figures.common import plt, save_figure

GROUP_COLOURS = {"patch": "C0", "cls": "C3", "register": "C2"}


def norm_histograms(histograms: dict[str, Any], thresholds: list[dict[str, Any]], title: str, path: str | Path,
                    stages: Mapping[int, int] | None = None, columns: int = 6) -> Path:
    """Token-norm histograms of one model on log-log axes, one panel per token layer (every layer, ``columns``
    per row), patch, CLS and register tokens in their own colours, x ticks labelled with their values; every
    threshold that applies to a layer drawn as a vertical line (on Swin / PVT-v2 a stage's thresholds in that
    stage's layers: ``stages`` maps token layer -> stage)."""
    edges = np.asarray(histograms["edges"])
    layers = sorted({int(k) for counts in histograms["counts"].values() for k in counts})
    cols = min(columns, len(layers))
    rows = -(-len(layers) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.7 * cols, 2.5 * rows + 0.4), squeeze=False, sharey=True,
                             layout="constrained")
    centres = np.sqrt(edges[:-1] * edges[1:])
    specs = list(dict.fromkeys(t["spec"] for t in thresholds))
    for ax, layer in zip(axes.ravel(), layers, strict=False):
        for group, counts in histograms["counts"].items():
            if str(layer) in counts and sum(counts[str(layer)]):
                values = np.asarray(counts[str(layer)], dtype=float)
                ax.step(centres, np.where(values > 0, values, np.nan), where="mid", color=GROUP_COLOURS[group],
                        label=group, lw=1)
        stage = (stages or {}).get(layer)
        drawn = []
        for t in thresholds:
            if t.get("stage") not in (None, stage) or not np.isfinite(t["value"]):
                continue
            if edges[0] <= t["value"] <= edges[-1]:
                ax.axvline(t["value"], color="k", ls=("-", "--", ":")[specs.index(t["spec"]) % 3], lw=0.8,
                           label=f"threshold {t['spec']}")
                drawn.append(t["value"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        shown = [c for g in histograms["counts"].values() if str(layer) in g
                 for c, n in zip(centres, g[str(layer)], strict=True) if n > 0] + drawn
        low, high = (min(shown) / 1.08, max(shown) * 1.08) if shown else (edges[0], edges[-1])
        ax.set_xlim(low, high)  # four labelled values, however narrow the range (log axes label decades only)
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(np.geomspace(low * 1.02, high / 1.02, 4)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.tick_params(labelsize=6)
        ax.set_ylim(bottom=0.7)
        ax.set_title(f"layer {layer}" + (f" (stage {stage})" if stage else ""), fontsize=8)
        ax.set_xlabel("token norm", fontsize=7)
    for ax in axes.ravel()[len(layers):]:
        ax.axis("off")
    for r in range(rows):
        axes[r][0].set_ylabel("tokens", fontsize=7)
    handles = {}
    for ax in axes.ravel():
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), fontsize=6, loc="outside lower center", ncols=len(handles))
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def high_norm_fraction(curves: Mapping[str, Mapping[str, list[tuple[int, float]]]], path: str | Path) -> Path:
    """High-norm fraction of patch tokens per layer: one panel per threshold mode, one line per model
    (``curves[spec][model] = [(layer, fraction), ...]``). Models of different depths share the x axis as relative
    depth, layer / the model's last layer (a 4-layer and an 8-block model both end at 1); the legend gives each
    model's last layer."""
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4), squeeze=False)
    for ax, (spec, models) in zip(axes[0], curves.items(), strict=True):
        for i, (model, points) in enumerate(models.items()):
            if points:
                layers, values = zip(*points, strict=True)
                last = max(max(layers), 1)
                ax.plot(np.asarray(layers, dtype=float) / last, values, marker="o", ms=3, color=f"C{i}",
                        label=f"{model} (last layer {last})")
        ax.set_title(f"threshold {spec}", fontsize=9)
        ax.set_xlabel("relative depth: token layer / last layer\n(block for Swin / PVT-v2)", fontsize=8)
        ax.set_xlim(-0.04, 1.04)
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
            if prefix > 1:  # the model is named once per row; each panel gives only its register mass
                axes[row][i].set_title(f"on registers {float(rows[i, 1:prefix].sum()):.2f}", fontsize=6)
        axes[row][0].set_ylabel(label, fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8, label="CLS attention (last layer, heads averaged)")
    return save_figure(fig, path)
