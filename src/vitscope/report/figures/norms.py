"""Figures of token norms: per-layer histograms with the threshold, and per-image high-norm maps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vitscope.report.figures.common import plt, readable_log_ticks, save_figure
from vitscope.report.registers.figures import GROUP_COLOURS

THRESHOLD_STYLE = {"color": "black", "ls": "--", "lw": 1}  # apart from the CLS token's red
NEAR_THRESHOLD = 1.5  # a threshold within this factor of a panel's data widens that panel to show it


def norm_histograms(norms: list[np.ndarray], names: list[str], threshold: float, spec: str,
                    path: str | Path, model: str | None = None,
                    prefix: Mapping[str, list[np.ndarray]] | None = None, threshold_layer: str | None = None) -> Path:
    """One log-log histogram of token norms per layer (``names``: token layers), each panel on its own x range
    (its tokens, and the threshold when within ``NEAR_THRESHOLD`` of them) with plain-number ticks. The high-norm
    threshold (set at ``threshold_layer``) is a dashed line where it falls inside a panel, and named with an arrow
    in the x label where it lies beyond. ``norms`` holds each layer's patch-token norms (the threshold's
    candidates); ``prefix`` the other tokens by group (``{"cls": [...], "register": [...]}``, one array per layer),
    drawn in their own colours so that the CLS token's own bump is not read as a high-norm mode of the patches.
    The legend sits below the panels; ``model`` names the model in the heading."""
    groups = {"patch": norms, **{k: v for k, v in (prefix or {}).items() if v}}
    cols = min(4, len(norms))
    rows = math.ceil(len(norms) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.7 * rows + 0.4), squeeze=False, layout="constrained")
    shown_threshold = bool(np.isfinite(threshold) and threshold > 0)
    for i, (ax, name) in enumerate(zip(axes.ravel(), names, strict=False)):
        layer = {group: values[i][values[i] > 0] for group, values in groups.items() if values[i].size}
        drawn = np.concatenate(list(layer.values()))
        low, high = float(drawn.min()) / 1.05, float(drawn.max()) * 1.05
        if shown_threshold and low / NEAR_THRESHOLD <= threshold <= high * NEAR_THRESHOLD:
            low, high = min(low, threshold / 1.05), max(high, threshold * 1.05)
        bins = np.geomspace(low, high, 41)
        for group, values in layer.items():
            ax.hist(values, bins=bins, histtype="step" if group != "patch" else "stepfilled",
                    color=GROUP_COLOURS.get(group, "C1"), alpha=1.0 if group != "patch" else 0.6,
                    label=_group_label(group, groups[group]))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_xlabel(_x_label(threshold, low, high) if shown_threshold else "token norm", fontsize=7)
        if shown_threshold and low <= threshold <= high:
            ax.axvline(threshold, **THRESHOLD_STYLE, label=f"threshold {spec} = {threshold:.3g}")
        readable_log_ticks(ax, "x")
        readable_log_ticks(ax, "y")  # counts: plain numbers, as many as fit
        ax.tick_params(which="both", labelsize=7)
        ax.set_title(name, fontsize=8)
        if i % cols == 0:
            ax.set_ylabel("tokens", fontsize=7)
    for ax in axes.ravel()[len(norms):]:
        ax.axis("off")
    handles: dict[str, Any] = {}
    for ax in axes.ravel():
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="outside lower center", ncols=len(handles))
    where = f", set at {threshold_layer}" if threshold_layer else ""
    heading = f"token norms per token layer; dashed: threshold {spec} = {threshold:.3g}{where}"
    fig.suptitle(f"{model}: {heading}" if model else heading, fontsize=9)
    return save_figure(fig, path)


def _group_label(group: str, per_layer: list[np.ndarray]) -> str:
    """The legend's name of a token group, with its count when every layer has the same ("patch (6144 per
    layer)")."""
    counts = {int(np.size(values)) for values in per_layer}
    return f"{group} ({counts.pop()} per layer)" if len(counts) == 1 else group


def _x_label(threshold: float, low: float, high: float) -> str:
    """"token norm", with the threshold and an arrow toward it when it lies beyond the panel's range."""
    if threshold > high:
        return f"token norm (threshold {threshold:.3g} \u2192)"
    if threshold < low:
        return f"(\u2190 threshold {threshold:.3g}) token norm"
    return "token norm"


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
