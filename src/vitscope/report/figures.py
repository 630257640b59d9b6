"""Figures from locality statistics (matplotlib, Agg backend, PNG or SVG by file suffix)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vitscope.record import AttentionStats  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` atomically and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=130, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def behaviour_space(panels: Mapping[str, AttentionStats], path: str | Path, unit: str = "normalized") -> Path:
    """MAD (x) against normalised entropy (y): one point per head, coloured by layer, one panel per entry,
    with the per-layer mean path drawn through it."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, (title, stats) in zip(axes[0], panels.items(), strict=True):
        mad, ent = stats.mad.numpy(), stats.entropy.numpy()
        depth = len(stats.layers)
        for i, layer in enumerate(stats.layers):
            ax.scatter(mad[i], ent[i], s=18, color=cmap(i / max(depth - 1, 1)), label=f"layer {layer + 1}",
                       edgecolors="none", alpha=0.85)
        ax.plot(np.nanmean(mad, axis=1), np.nanmean(ent, axis=1), color="black", lw=1, marker=".",
                label="layer mean")
        ax.set_title(title)
        ax.set_xlabel(f"mean attention distance ({unit})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("normalised entropy")
    axes[0][-1].legend(fontsize=7, loc="best")
    return save_figure(fig, path)
