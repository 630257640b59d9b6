"""Figures from locality statistics (matplotlib, Agg backend, PNG or SVG by file suffix)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from vitscope.files import atomic_path  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` atomically and close it."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Path(path)


def behaviour_space(panels: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path,
                    unit: str = "normalized") -> Path:
    """MAD (x) against normalised entropy (y): one point per head, coloured by layer, one panel per entry
    (title -> (mad, entropy), each (layers, heads)), with the per-layer mean path drawn through it."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, (title, (mad, ent)) in zip(axes[0], panels.items(), strict=True):
        depth = mad.shape[0]
        for layer in range(depth):
            ax.scatter(mad[layer], ent[layer], s=16, color=cmap(layer / max(depth - 1, 1)),
                       label=f"layer {layer + 1}", edgecolors="none", alpha=0.8)
        ax.plot(np.nanmean(mad, axis=1), np.nanmean(ent, axis=1), color="black", lw=1, marker=".",
                label="layer mean")
        ax.set_title(title)
        ax.set_xlabel(f"mean attention distance ({unit})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("normalised entropy")
    axes[0][-1].legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def per_layer(curves: Mapping[str, np.ndarray], ylabel: str, path: str | Path) -> Path:
    """Mean over heads per layer for each condition (title -> (layers, heads)), head range shaded."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for title, values in curves.items():
        layers = np.arange(1, values.shape[0] + 1)
        line = ax.plot(layers, np.nanmean(values, axis=1), marker="o", ms=3, label=title)[0]
        ax.fill_between(layers, np.nanmin(values, axis=1), np.nanmax(values, axis=1), color=line.get_color(),
                        alpha=0.12)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def accuracy_vs_locality(points: Sequence[dict], path: str | Path) -> Path:
    """Accuracy against minimum early-layer MAD, one point per condition (mean +- std over seeds),
    filled markers for conditions with CutMix."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for p in points:
        marker = "o" if p["cutmix"] else "s"
        face = "C3" if p["cutmix"] else "white"
        ax.errorbar(p["min_early_mad"], p["accuracy"], xerr=p["min_early_mad_std"], yerr=p["accuracy_std"],
                    fmt=marker, mfc=face, mec="C3" if p["cutmix"] else "C0", ecolor="grey", capsize=2)
        ax.annotate(p["condition"], (p["min_early_mad"], p["accuracy"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("minimum early-layer MAD (normalized)")
    ax.set_ylabel("top-1 accuracy")
    ax.set_title("filled circles: with CutMix; open squares: without")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def attention_examples(image: np.ndarray, maps: Mapping[str, np.ndarray], grid: tuple[int, int], prefix: int,
                       path: str | Path) -> Path:
    """One image and, per layer (name -> (heads, T, T)), each head's CLS attention and the attention of
    the centre patch query, on the patch grid."""
    gh, gw = grid
    heads = next(iter(maps.values())).shape[0]
    rows = 2 * len(maps)
    fig, axes = plt.subplots(rows, heads + 1, figsize=(1.3 * (heads + 1), 1.35 * rows), squeeze=False)
    query = prefix + (gh // 2) * gw + gw // 2
    for r, (name, attn) in enumerate(maps.items()):
        for kind, row in (("CLS", 2 * r), ("centre patch", 2 * r + 1)):
            axes[row][0].imshow(image)
            axes[row][0].set_title(f"{name}\n{kind}", fontsize=7)
            if kind == "centre patch":
                cy, cx = (gh // 2 + 0.5) * image.shape[0] / gh, (gw // 2 + 0.5) * image.shape[1] / gw
                axes[row][0].plot([cx], [cy], "r+", ms=8)
            for h in range(heads):
                source = 0 if kind == "CLS" and prefix > 0 else query
                values = attn[h, source, prefix:].reshape(gh, gw)
                axes[row][h + 1].imshow(values, cmap="magma")
                axes[row][h + 1].set_title(f"head {h + 1}", fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    return save_figure(fig, path)
