"""Report figures, checked on the figure's own data: one colour per model, integer layer ticks, legends off the
lines, colour bars on colour maps, exact zeros in their own colour, tick values and thresholds on histograms."""

import numpy as np
import pytest
from matplotlib.collections import Collection
from matplotlib.colors import to_rgba


@pytest.fixture
def figures_made(monkeypatch):
    """Every matplotlib figure the report modules save, kept for inspection."""
    import vitscope.report.figures.locality as base
    import vitscope.report.figures.norms as nf
    import vitscope.report.figures.probes as pf
    import vitscope.report.registers.figures as rf
    import vitscope.report.sparse.figures as sf

    made = []
    real = base.save_figure

    def keep(fig, path):
        fig.canvas.draw()  # lay out (ticks, legends) as the saved file has them
        made.append(fig)
        return real(fig, path)

    for module in (base, nf, pf, rf, sf):
        monkeypatch.setattr(module, "save_figure", keep)
    return made


def _colorbars(fig) -> int:
    return sum(ax.get_label() == "<colorbar>" for ax in fig.axes)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_layer_curves_keep_one_colour_per_model_integer_ticks_and_a_legend_off_the_axes(tmp_path, figures_made):
    from vitscope.report.sparse.figures import layer_curves

    layers = np.arange(1, 5, dtype=float)
    flat = (layers, np.full(4, 0.5), np.zeros(4))
    curves = {"top1": {"entmax15": flat, "softmax": flat, "softmax (random init)": flat, "chance": flat},
              "cosine": {"softmax": flat, "entmax15": flat, "entmax15 (random init)": flat}}  # another order
    layer_curves(curves, ["top1", "cosine"], tmp_path / "c.png", "title")
    fig = figures_made[-1]
    colours = {}
    for ax in fig.axes:
        for line in ax.lines:
            model = line.get_label().replace(" (random init)", "")
            colours.setdefault(model, set()).add(to_rgba(line.get_color()))
            if "(random init)" in line.get_label():
                assert line.get_linestyle() == "--"
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
    assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == 3
    legend = fig.legends[0].get_window_extent()
    assert not any(_overlaps(legend, ax.get_window_extent()) for ax in fig.axes)


def test_cls_attention_heads_have_a_colour_bar_and_zeros_in_their_own_colour(tmp_path, figures_made):
    from vitscope.report.sparse.figures import ZERO_COLOUR, attention_heads

    attn = np.full((2, 5, 5), 0.25)
    attn[:, 0, 1:3] = 0.0  # two exact zeros in the CLS row of each head
    attention_heads(np.zeros((3, 8, 8), np.uint8), {"entmax15": attn}, (2, 2), 1, tmp_path / "a.png")
    fig = figures_made[-1]
    assert _colorbars(fig) == 1
    maps = [im for ax in fig.axes if ax.get_label() != "<colorbar>" for im in ax.images if im.get_array().ndim == 2]
    assert len(maps) == 2
    rgba = maps[0].to_rgba(maps[0].get_array())
    assert np.allclose(rgba[0, 0], to_rgba(ZERO_COLOUR)) and not np.allclose(rgba[1, 0], to_rgba(ZERO_COLOUR))
    assert "50% zero" in fig.axes[1].get_title()


def test_hierarchical_norm_histograms_show_every_layer_tick_values_and_each_stages_threshold(tmp_path, figures_made):
    from vitscope.report.registers.figures import norm_histograms

    edges = np.geomspace(1.0, 4.0, 9)  # less than a decade: matplotlib's default would label no tick
    counts = {str(layer): [0, 1, 5, 9, 5, 1, 0, 0] for layer in range(1, 8)}
    thresholds = [{"spec": "auto", "value": 1.5, "stage": 1}, {"spec": "auto", "value": 3.0, "stage": 2}]
    stages = {layer: 1 if layer <= 3 else 2 for layer in range(1, 8)}
    norm_histograms({"edges": edges.tolist(), "counts": {"patch": counts}}, thresholds, "swin", tmp_path / "h.png",
                    stages=stages)
    fig = figures_made[-1]
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [f"layer {i} (stage {stages[i]})" for i in range(1, 8)]
    for layer, ax in enumerate(panels, 1):
        assert any(t.get_text() for t in ax.get_xticklabels())
        lines = [line.get_xdata()[0] for line in ax.lines if line.get_label().startswith("threshold")]
        assert lines == [1.5 if layer <= 3 else 3.0]


def test_per_layer_has_a_heading_and_names_its_band(tmp_path, figures_made):
    from vitscope.report.figures.locality import per_layer

    per_layer({"baseline": np.random.default_rng(0).random((4, 3))}, "MAD", tmp_path / "p.png", reference=0.4,
              title="MAD per layer", band="min-max over heads and seeds")
    ax = figures_made[-1].axes[0]
    assert ax.get_title() == "MAD per layer"
    assert "baseline: min-max over heads and seeds" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_locality_settings_show_each_runs_effective_protocol_and_layers_read_as_numbers():
    from vitscope.report.locality.page import _settings, effective_config, layer_list

    config = {"label_smoothing": 0.1, "cutmix_alpha": 1.0, "epochs": 2}
    assert effective_config(config, "baseline") == {"label_smoothing": "off", "cutmix_alpha": "off", "epochs": 2}
    assert effective_config(config, "baseline+cutmix")["cutmix_alpha"] == 1.0
    runs = [{"condition": c, "seed": 0, "train_config": config} for c in ("baseline", "baseline+cutmix")]
    shared, per_run = _settings({"runs": runs}).split("<h3>Per run</h3>")
    assert "cutmix_alpha" not in shared and "<td>label_smoothing</td><td>off</td>" in shared
    assert "<td>baseline seed 0</td><td>off</td>" in per_run
    assert (layer_list([1]), layer_list([1, 2]), layer_list([1, 2, 3]), layer_list([1, 3, 5])) == (
        "1", "1 and 2", "1-3", "1, 3 and 5")


def _tick_label_boxes(fig, ax, axis: str = "x"):
    """Window extents of the tick labels ``ax`` shows on ``axis`` (major and minor, inside the limits)."""
    renderer = fig._get_renderer()
    target = ax.xaxis if axis == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    index = 0 if axis == "x" else 1
    labels = [t for t in target.get_ticklabels(which="both")
              if t.get_visible() and t.get_text() and low <= t.get_position()[index] <= high]
    return [t.get_window_extent(renderer) for t in labels]


def test_norm_histogram_log_tick_labels_do_not_overlap(tmp_path, figures_made):
    """Narrow, wide and outlier-stretched ranges (the last overlapped as 3x10^1 4x10^1 6x10^1 2x10^2 3x10^2)."""
    from vitscope.report.figures.norms import norm_histograms

    rng = np.random.default_rng(0)
    norms = [rng.lognormal(np.log(30), 0.15, 500), rng.lognormal(np.log(30), 0.6, 500),
             rng.lognormal(np.log(3), 2.0, 500), np.r_[rng.lognormal(np.log(40), 0.1, 500), [300.0]],
             rng.uniform(1000, 1400, 300)]
    norm_histograms(norms, ["1", "2", "3", "4", "5"], 60.0, "percentile:98", tmp_path / "h.png", model="m")
    fig = figures_made[-1]
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 5
    for ax in panels:
        for axis in ("x", "y"):
            boxes = _tick_label_boxes(fig, ax, axis)
            assert len(boxes) >= 2, f"panel {ax.get_title()} {axis}: fewer than two labelled ticks"
            assert not any(_overlaps(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), ax.get_title()


def test_layer_curves_keep_every_line_off_the_frame(tmp_path, figures_made):
    """A flat softmax MAD line (no spread over seeds) sat on the top frame; now every mean +- std lies inside the
    limits with a margin, and zero stays on the axis."""
    from vitscope.report.sparse.figures import layer_curves

    layers = np.arange(1, 5, dtype=float)
    mad = {"softmax": (layers, np.full(4, 0.4178), np.zeros(4)),
           "entmax15": (layers, np.array([0.40, 0.41, 0.405, 0.39]), np.full(4, 0.004))}
    signed = {"softmax": (layers, np.array([-0.2, 0.1, 0.3, 0.0]), np.full(4, 0.02))}
    layer_curves({"attention MAD": mad, "cosine": signed}, ["attention MAD", "cosine"], tmp_path / "c.png")
    for ax, entries in zip(figures_made[-1].axes, (mad, signed), strict=False):
        low, high = ax.get_ylim()
        top = max(float((m + s).max()) for _, m, s in entries.values())
        bottom = min(float((m - s).min()) for _, m, s in entries.values())
        assert low <= 0 <= high
        assert high - top > 0.05 * (high - low)
        assert bottom >= 0 or bottom - low > 0.05 * (high - low)


def test_high_norm_fraction_puts_models_of_different_depths_on_relative_depth(tmp_path, figures_made):
    """A 4-layer and an 8-block model both run from their first layer to relative depth 1 (layer / last layer),
    each line's x the layers divided by its own depth, inside the x limits; the legend names each depth."""
    from vitscope.report.registers.figures import high_norm_fraction

    curves = {"auto": {"vit-micro": [(layer, 0.01 * layer) for layer in range(0, 5)],
                       "swin": [(block, 0.02) for block in range(1, 9)]}}
    high_norm_fraction(curves, tmp_path / "f.png")
    (ax,) = [a for a in figures_made[-1].axes if a.lines]
    lines = {line.get_label(): line.get_xdata() for line in ax.lines}
    assert set(lines) == {"vit-micro (last layer 4)", "swin (last layer 8)"}
    np.testing.assert_allclose(lines["vit-micro (last layer 4)"], np.arange(0, 5) / 4)
    np.testing.assert_allclose(lines["swin (last layer 8)"], np.arange(1, 9) / 8)
    low, high = ax.get_xlim()
    assert low < 0 and high > 1  # both ends inside, with a margin


def test_analyze_norm_histograms_draw_cls_apart_from_patches_and_label_narrow_ranges(tmp_path, figures_made):
    # a real ViT-S/14's CLS token (one per image, norm 2) sits apart from its patches (norm about 1): drawn in the
    # patches' colour it reads as a separate high-norm mode of patches
    from vitscope.report.figures.norms import norm_histograms
    from vitscope.report.registers.figures import GROUP_COLOURS

    rng = np.random.default_rng(0)
    patches = [rng.uniform(0.8, 1.3, 2560)]  # less than a decade: default log axes would label no tick
    cls = [np.full(10, 2.0)]
    norm_histograms(patches, ["layer 1"], 50.0, "auto", tmp_path / "h.png", prefix={"cls": cls})
    ax = figures_made[-1].axes[0]
    drawn = {p.get_label(): p for p in ax.patches if not p.get_label().startswith("_")}
    cls_drawn, patch_drawn = drawn["cls (10 per layer)"], drawn["patch (2560 per layer)"]
    assert to_rgba(cls_drawn.get_edgecolor()) == to_rgba(GROUP_COLOURS["cls"])
    assert to_rgba(cls_drawn.get_edgecolor())[:3] != to_rgba(patch_drawn.get_facecolor())[:3]
    labels = [float(t.get_text()) for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) >= 2 and 0.75 < ax.get_xlim()[0] < 0.8 and 2.0 < ax.get_xlim()[1] < 2.2  # patches to CLS
    assert not ax.lines and ax.get_xlabel() == "token norm (threshold 50 \u2192)"  # far beyond: named, not drawn


def _round_value(value: float) -> bool:
    """A tick value a reader can take in at a glance: its mantissa a multiple of 0.25 (1, 1.5, 2.5, 30, 0.75)."""
    mantissa = value / 10 ** np.floor(np.log10(value))
    return abs(mantissa * 4 - round(mantissa * 4)) < 1e-9


def test_norm_histograms_give_each_layer_its_own_range_round_ticks_and_the_threshold(tmp_path, figures_made):
    """A last layer far above the others (a real DINOv2 ViT-S/14: layers 1-11 below 15, layer 12 up to 60) no
    longer stretches every panel to its threshold: each panel spans its own tokens, with round tick values (not
    0.936 or 3.73); the threshold is drawn where it falls inside a panel and named with an arrow where it does not;
    the legend sits below the panels."""
    from vitscope.report.figures.norms import norm_histograms

    rng = np.random.default_rng(0)
    norms = [rng.lognormal(np.log(centre), 0.15, 2000) for centre in (1.2, 3.0, 9.0)]
    norms.append(rng.uniform(25, 61, 2000))
    norm_histograms(norms, ["layer 1", "layer 2", "layer 3", "layer 4"], 57.8, "percentile:98", tmp_path / "h.png",
                    threshold_layer="layer 4")
    fig = figures_made[-1]
    panels = [ax for ax in fig.axes if ax.axison]
    for ax, values in zip(panels, norms, strict=True):
        low, high = ax.get_xlim()
        filled = np.log(values.max() / values.min()) / np.log(high / low)
        assert filled > 0.8, f"{ax.get_title()}: its tokens fill {filled:.0%} of the panel"
        shown = [t.get_position()[0] for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0]
                 <= high]
        assert len(shown) >= 2 and all(_round_value(v) for v in shown), (ax.get_title(), shown)
    for ax in panels[:3]:
        assert not ax.lines and ax.get_xlabel() == "token norm (threshold 57.8 \u2192)"
    (line,) = panels[3].lines
    assert line.get_xdata()[0] == 57.8 and panels[3].get_xlabel() == "token norm"
    assert "set at layer 4" in fig._suptitle.get_text()
    legend = fig.legends[0].get_window_extent()
    assert not any(_overlaps(legend, ax.get_window_extent()) for ax in panels)


def _visible_ticks(ax):
    low, high = ax.get_xlim()
    return [float(t) for t in ax.get_xticks() if low <= t <= high]


def test_one_layer_plots_show_that_layer_as_a_whole_number_and_draw_everything_their_legend_names(
        tmp_path, figures_made):
    """A probe or MAD plot of one layer labelled 11.40, 11.55, ... and showed a chance line (and a min-max band)
    in the legend only: a line through one point draws nothing. Now the one tick reads 12 and every legend entry
    has something drawn on the axes."""
    from vitscope.report.figures.locality import per_layer
    from vitscope.report.figures.probes import score_by_layer

    rows = [{"model": model, "group": "cls", "layer": 12, "metric": "class_top1", "value": value}
            for model, value in (("vit", 0.8), ("vit (random init)", 0.3), ("chance", 0.1))]
    score_by_layer(rows, "class_top1", tmp_path / "s.png")
    per_layer({"vit": np.array([[0.1, 0.2, 0.3]])}, "MAD", tmp_path / "p.png", reference=0.4178)
    for fig, layer in zip(figures_made, (12, 1), strict=True):
        ax = fig.axes[0]
        assert _visible_ticks(ax) == [layer]
        renderer = fig._get_renderer()
        handles, labels = ax.get_legend_handles_labels()
        assert "chance / cls" in labels or layer == 1
        for handle, label in zip(handles, labels, strict=True):
            if isinstance(handle, Collection):  # an area (a band): it needs both sides
                box = handle.get_datalim(ax.transData).transformed(ax.transData)
                assert box.width > 3 and box.height > 3, f"{label!r} is in the legend but draws no area"
            else:
                box = handle.get_window_extent(renderer)
                assert box.width > 3 or box.height > 3, f"{label!r} is in the legend but draws nothing"


def _data_points(ax):
    """Display coordinates of everything plotted on ``ax``: line vertices and scatter or error-bar points."""
    points = [line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
              for line in ax.lines if not line.get_label().startswith("uniform")]  # reference lines span the axes
    points += [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections if len(c.get_offsets())]
    return np.concatenate([p for p in points if len(p)])


def test_legends_cover_no_data(tmp_path, figures_made):
    """Probe scores, the behaviour space (its colour by layer on a colour bar) and accuracy against locality put
    their legend where no point or line is: outside the axes."""
    from vitscope.report.figures.locality import accuracy_vs_locality, behaviour_space
    from vitscope.report.figures.probes import score_by_layer

    rng = np.random.default_rng(0)
    rows = [{"model": model, "group": group, "layer": layer, "metric": "class_top1", "value": value + 0.02 * layer}
            for layer in range(13) for group in ("cls", "patch")
            for model, value in (("vit", 0.5), ("vit (random init)", 0.2), ("chance", 0.1))]
    score_by_layer(rows, "class_top1", tmp_path / "s.png")
    mad, ent = rng.uniform(0.2, 0.42, (12, 6)), rng.uniform(0.5, 1.0, (12, 6))  # heads everywhere, the corners too
    behaviour_space({"a": (mad, ent)}, tmp_path / "b.png", uniform=0.4178)
    points = [{"condition": c, "cutmix": "cutmix" in c, "min_early_mad": m, "min_early_mad_std": 0.01,
               "accuracy": a, "accuracy_std": 0.01}
              for c, m, a in (("baseline", 0.02, 0.5), ("baseline+cutmix", 0.01, 0.6), ("modern", 0.4, 0.5))]
    accuracy_vs_locality(points, tmp_path / "a.png", uniform=0.4178)
    for fig in figures_made:
        (legend,) = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        box = legend.get_window_extent()
        ax = fig.axes[0]
        inside = [(x, y) for x, y in _data_points(ax) if box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1]
        assert not inside and not _overlaps(box, ax.get_window_extent()), (ax.get_title(), inside[:3])
    assert any(ax.get_label() == "<colorbar>" for ax in figures_made[1].axes)


def _crosses(points: np.ndarray, box) -> bool:
    """Whether the polyline through ``points`` (display coordinates) passes through ``box``, sampled finely."""
    for a, b in zip(points[:-1], points[1:], strict=True):
        for t in np.linspace(0, 1, 200):
            x, y = a + t * (b - a)
            if box.x0 < x < box.x1 and box.y0 < y < box.y1:
                return True
    return False


@pytest.mark.parametrize(("mad", "ent"), [(0.41, 0.985), (0.05, 0.2), (0.2, 0.55), (0.41, 0.5)],
                         ids=["near-uniform", "local", "middle", "right-edge"])
def test_the_zoom_inset_is_crossed_by_no_line_point_or_legend(tmp_path, figures_made, mad, ent):
    """Wherever the heads crowd (near uniform attention at the top right, local and low entropy at the bottom
    left, mid-axes), the inset, its tick labels and title lie clear of the reference lines, the layer-mean path,
    every head, the marked region and the legend (the uniform-MAD line once ran through it)."""
    from vitscope.report.figures.locality import behaviour_space

    rng = np.random.default_rng(1)
    heads = (mad + rng.normal(0, 0.004, (8, 8)), ent + rng.normal(0, 0.004, (8, 8)))
    behaviour_space({"crowded": heads}, tmp_path / "b.png", uniform=0.4178)
    fig = figures_made[-1]
    ax = fig.axes[0]
    (inset,) = [child for child in ax.child_axes if child.get_label() == "zoom"]
    renderer = fig._get_renderer()
    box = inset.get_tightbbox(renderer)  # with its tick labels and title
    for line in ax.lines:
        drawn = line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        assert not _crosses(drawn, box), f"{line.get_label()!r} crosses the inset"
    heads_drawn = ax.collections[0].get_offset_transform().transform(ax.collections[0].get_offsets())
    assert not any(box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1 for x, y in heads_drawn)
    (x0, x1), (y0, y1) = inset.get_xlim(), inset.get_ylim()
    region = ax.transData.transform([(x0, y0), (x1, y1)])
    assert not (region[0][0] < box.x1 and box.x0 < region[1][0] and region[0][1] < box.y1 and box.y0 < region[1][1])
    legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend())]
    assert legends and not any(_overlaps(legend.get_window_extent(), box) for legend in legends)
