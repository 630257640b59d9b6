"""Figures from locality statistics (PNG or SVG by file suffix; shared by the locality report and ``analyze``).

Every MAD or entropy axis starts at 0 and shows the uniform-attention reference (entropy 1; MAD of uniform
attention on the grid, 0.4178 normalised on 8x8), so that values sitting at "no structure" read as such and a
tiny spread is not blown up to fill the axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.colors
import matplotlib.ticker
import numpy as np

from vitscope.metrics.locality import uniform_mad  # noqa: F401 (re-exported: every page's reference line)
from vitscope.report.figures.common import REFERENCE_STYLE, axis_top, integer_ticks, layer_axis, plt, save_figure


def behaviour_space(panels: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path,
                    unit: str = "normalized", uniform: float | None = None) -> Path:
    """MAD (x) against normalised entropy (y): one point per head, coloured by layer (colour bar), one panel per
    entry (title -> (mad, entropy), each (layers, heads)), with the per-layer mean path drawn through it. Entropy
    spans [0, 1] with the uniform line at 1; ``uniform`` (MAD of uniform attention, in ``unit``) is drawn too.
    The legend sits outside the panels, so that it covers no point and no zoom inset."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.0, 3.8), squeeze=False, sharey=True,
                             sharex=True, layout="constrained")
    depth = max(mad.shape[0] for mad, _ in panels.values())
    cmap = plt.get_cmap("viridis", depth)
    norm = matplotlib.colors.BoundaryNorm(np.arange(0.5, depth + 1.5), depth)
    right = axis_top(np.concatenate([np.ravel(m) for m, _ in panels.values()]), uniform)
    shown = None
    for ax, (title, (mad, ent)) in zip(axes[0], panels.items(), strict=True):
        layers = np.broadcast_to(np.arange(1, mad.shape[0] + 1)[:, None], mad.shape)
        shown = ax.scatter(mad.ravel(), ent.ravel(), c=layers.ravel(), cmap=cmap, norm=norm, s=16,
                           edgecolors="none", alpha=0.8)
        ax.plot(np.nanmean(mad, axis=1), np.nanmean(ent, axis=1), color="black", lw=1, marker=".",
                label="layer mean")
        ax.axhline(1.0, **REFERENCE_STYLE, label="uniform attention (entropy 1"
                   + (f", MAD {uniform:.4g})" if uniform is not None else ")"))
        if uniform is not None:
            ax.axvline(uniform, **REFERENCE_STYLE)
        ax.set_xlim(0, right)
        ax.set_ylim(0, 1.05)
        ax.set_title(title)
        ax.set_xlabel(f"mean attention distance ({unit})")
        ax.grid(alpha=0.3)
        _zoom_inset(ax, mad, ent, cmap, norm, uniform)
    axes[0][0].set_ylabel("normalised entropy")
    bar = fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8, pad=0.02)
    bar.set_label("layer", fontsize=8)
    integer_ticks(bar.ax.yaxis)
    fig.legend(*axes[0][-1].get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncols=2)
    return save_figure(fig, path)


INSET_SIZES = ((0.4, 0.36), (0.32, 0.3), (0.26, 0.24))  # width, height in axes fractions, largest first
INSET_LABEL_ROOM = (0.09, 0.08, 0.07)  # left (y tick labels), below (x tick labels), above (title): axes fractions


def _zoom_inset(ax, mad: np.ndarray, ent: np.ndarray, cmap, norm, uniform: float | None) -> None:
    """When the heads crowd into a small part of the full [0, reference] axes (e.g. all near uniform attention),
    an inset (label "zoom") shows them with limits from the data plus a 15 % margin, the reference lines that fall
    inside, and its region marked on the main axes. It goes where no point, reference line or the marked region
    falls on it or on its labels, as far from the heads as that allows (``_inset_place``)."""
    x, y = np.ravel(mad), np.ravel(ent)
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.any():
        return
    x, y = x[keep], y[keep]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    if max((x.max() - x.min()) / (x1 - x0), (y.max() - y.min()) / (y1 - y0)) > 0.25:
        return  # the points already spread over the axes

    def padded(low: float, high: float, full: float) -> tuple[float, float]:
        span = max(high - low, 0.01 * full)
        return low - 0.15 * span, high + 0.15 * span

    zoom_x, zoom_y = padded(float(x.min()), float(x.max()), x1 - x0), padded(float(y.min()), float(y.max()), y1 - y0)
    frac_x = lambda v: (v - x0) / (x1 - x0)  # noqa: E731
    frac_y = lambda v: (v - y0) / (y1 - y0)  # noqa: E731
    region = (frac_x(zoom_x[0]), frac_y(zoom_y[0]), frac_x(zoom_x[1]), frac_y(zoom_y[1]))
    lines = {"x": [frac_x(uniform)] if uniform is not None else [], "y": [frac_y(1.0)]}
    inset = ax.inset_axes(_inset_place(region, lines), label="zoom")
    layers = np.broadcast_to(np.arange(1, mad.shape[0] + 1)[:, None], mad.shape)
    inset.scatter(mad.ravel(), ent.ravel(), c=layers.ravel(), cmap=cmap, norm=norm, s=10, edgecolors="none",
                  alpha=0.8)
    inset.set_xlim(*zoom_x)
    inset.set_ylim(*zoom_y)
    for value, draw in ((1.0, inset.axhline), (uniform, inset.axvline)):
        limits = inset.get_ylim() if draw == inset.axhline else inset.get_xlim()
        if value is not None and limits[0] <= value <= limits[1]:
            draw(value, **REFERENCE_STYLE)
    inset.tick_params(labelsize=6)
    inset.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(3))
    inset.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(3))
    inset.set_title("zoom on the heads", fontsize=6, pad=2)
    ax.indicate_inset_zoom(inset, edgecolor="0.4")


def _inset_place(region: tuple[float, float, float, float], lines: Mapping[str, list[float]]) -> list[float]:
    """The inset's [x0, y0, width, height] in axes fractions: the largest size in ``INSET_SIZES`` for which some
    position keeps the inset and its labels (``INSET_LABEL_ROOM``) off the heads' ``region`` (x0, y0, x1, y1) and
    off the reference ``lines`` (axes fractions by direction); among those positions the farthest from the
    region. With no clear position at any size, the smallest inset farthest from the region."""
    left, below, above = INSET_LABEL_ROOM
    gap = 0.02  # clear space kept around the region
    centre = ((region[0] + region[2]) / 2, (region[1] + region[3]) / 2)
    for width, height in INSET_SIZES:
        placed = []
        for x0 in np.linspace(left, 1 - width - gap, 13):
            for y0 in np.linspace(below, 1 - height - above, 13):
                box = (x0 - left - gap, y0 - below - gap, x0 + width + gap, y0 + height + above + gap)
                crossed = box[0] < region[2] and region[0] < box[2] and box[1] < region[3] and region[1] < box[3]
                crossed |= any(box[0] <= v <= box[2] for v in lines.get("x", []))
                crossed |= any(box[1] <= v <= box[3] for v in lines.get("y", []))
                distance = float(np.hypot(x0 + width / 2 - centre[0], y0 + height / 2 - centre[1]))
                placed.append((not crossed, distance, [float(x0), float(y0), width, height]))
        if any(clear for clear, _, _ in placed):
            break
    return max(placed, key=lambda c: c[:2])[2]


def per_layer(curves: Mapping[str, np.ndarray], ylabel: str, path: str | Path, reference: float | None = None,
              reference_label: str = "uniform attention", title: str | None = None,
              band: str = "min-max over heads") -> Path:
    """Mean over heads per layer for each condition (title -> (layers, heads)), the ``band`` (range over the
    heads) shaded and named in the legend; the y axis starts at 0 and shows ``reference`` (e.g. the
    uniform-attention value) as a dashed line. Layers are token layers 1..L on integer ticks; the legend sits
    outside the axes so that it covers no line; ``title`` heads the figure."""
    fig, ax = plt.subplots(figsize=(7.4, 3.8))
    for i, (name, values) in enumerate(curves.items()):
        layers = np.arange(1, values.shape[0] + 1)
        line = ax.plot(layers, np.nanmean(values, axis=1), marker="o", ms=3, label=f"{name} (mean over heads)",
                       color=f"C{i}")[0]
        low, high = np.nanmin(values, axis=1), np.nanmax(values, axis=1)
        where = layers if len(layers) > 1 else layers + np.array([-0.15, 0.15])  # one layer: a band with a width
        ax.fill_between(where, low, high, color=line.get_color(), alpha=0.12 if len(layers) > 1 else 0.25,
                        label=f"{name}: {band}")
    if reference is not None:
        ax.axhline(reference, **REFERENCE_STYLE, label=f"{reference_label} ({reference:.4g})")
    ax.set_ylim(0, axis_top(np.concatenate([np.ravel(v) for v in curves.values()]), reference))
    ax.set_xlabel("layer")
    layer_axis(ax, [layer for v in curves.values() for layer in range(1, v.shape[0] + 1)])
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)


def accuracy_vs_locality(points: Sequence[dict], path: str | Path, uniform: float | None = None) -> Path:
    """Accuracy against minimum early-layer MAD, one point per condition (mean +- std over seeds),
    filled markers for conditions with CutMix; x from 0 with the uniform-attention MAD drawn."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    if uniform is not None:
        ax.axvline(uniform, **REFERENCE_STYLE, label=f"uniform attention ({uniform:.4g})")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # off the points
    ax.set_xlim(0, axis_top(np.asarray([p["min_early_mad"] for p in points]), uniform))
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
                       path: str | Path, title: str | None = None, vmax: float | None = None) -> Path:
    """One image and, per layer (name -> (heads, T, T)), each head's CLS attention and the attention of
    the centre patch query, on the patch grid. Every map shares one colour scale, 0 to ``vmax`` (default: the
    largest value shown; pass one value to compare figures), shown by a colour bar; ``title`` names the grid."""
    gh, gw = grid
    heads = next(iter(maps.values())).shape[0]
    rows = 2 * len(maps)
    fig, axes = plt.subplots(rows, heads + 1, figsize=(1.3 * (heads + 1) + 0.6, 1.35 * rows + 0.4), squeeze=False)
    query = prefix + (gh // 2) * gw + gw // 2
    shown = {}
    for r, (name, attn) in enumerate(maps.items()):
        for kind, row in (("CLS", 2 * r), ("centre patch", 2 * r + 1)):
            source = 0 if kind == "CLS" and prefix > 0 else query
            shown[row] = (name, kind, [attn[h, source, prefix:].reshape(gh, gw) for h in range(heads)])
    top = vmax if vmax is not None else max(float(np.max(v)) for _, _, values in shown.values() for v in values)
    last_map = None
    for row, (name, kind, values) in shown.items():
        axes[row][0].imshow(image)
        axes[row][0].set_title(f"{name}\n{kind} query", fontsize=7)
        if kind == "centre patch":
            cy, cx = (gh // 2 + 0.5) * image.shape[0] / gh, (gw // 2 + 0.5) * image.shape[1] / gw
            axes[row][0].plot([cx], [cy], "r+", ms=8)
        for h, value in enumerate(values):
            last_map = axes[row][h + 1].imshow(value, cmap="magma", vmin=0.0, vmax=top)
            axes[row][h + 1].set_title(f"head {h + 1}", fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    bar = fig.colorbar(last_map, ax=axes.ravel().tolist(), shrink=0.8, pad=0.02)
    bar.set_label(f"attention probability (uniform over patches = 1/{gh * gw})", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)
