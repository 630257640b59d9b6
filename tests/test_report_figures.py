"""Report figures, checked on the figure's own data: one colour per model, integer layer ticks, legends off the
lines, colour bars on colour maps, exact zeros in their own colour, tick values and thresholds on histograms."""

import numpy as np
import pytest
from matplotlib.colors import to_rgba


@pytest.fixture
def figures_made(monkeypatch):
    """Every matplotlib figure the report modules save, kept for inspection."""
    import vitscope.report.figures.locality as base
    import vitscope.report.figures.norms as nf
    import vitscope.report.registers.figures as rf
    import vitscope.report.sparse.figures as sf

    made = []
    real = base.save_figure

    def keep(fig, path):
        fig.canvas.draw()  # lay out (ticks, legends) as the saved file has them
        made.append(fig)
        return real(fig, path)

    for module in (base, nf, rf, sf):
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
    assert set(drawn) == {"patch (2560)", "cls (10)"}
    assert to_rgba(drawn["cls (10)"].get_edgecolor()) == to_rgba(GROUP_COLOURS["cls"])
    assert to_rgba(drawn["cls (10)"].get_edgecolor())[:3] != to_rgba(drawn["patch (2560)"].get_facecolor())[:3]
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) == 4 and float(labels[0]) < 0.8 and float(labels[-1]) > 45  # patches to threshold
    assert [line.get_xdata()[0] for line in ax.lines if line.get_label() == "threshold"] == [50.0]
