"""The locality report's honesty: verdicts with a threshold, each comparison once, references on every
MAD/entropy axis, shared colour scale, every run's settings; built from hand-made results (no training)."""

import datetime as dt
import math
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

from vitscope.report.figures import locality as figures
from vitscope.report.locality.page import build_report
from vitscope.studies.locality.results import LocalityResults
from vitscope.studies.locality.study import LocalityStudy, write_results


def test_uniform_mad_matches_the_definition():
    assert figures.uniform_mad((8, 8)) == pytest.approx(0.4178, abs=5e-5)
    assert figures.uniform_mad((8, 8), "patch") == pytest.approx(4.1365, abs=5e-5)
    ys, xs = np.meshgrid(np.arange(3), np.arange(5), indexing="ij")  # brute force on a 3 x 5 grid
    pts = np.stack([ys.ravel(), xs.ravel()], 1)
    d = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    assert figures.uniform_mad((3, 5), "pixel", 16) == pytest.approx(d.mean() * 16)


def record(condition, seed, mad, entropy, accuracy, study, cls_factor=1.0):
    layers, heads = 4, 4
    rng = np.random.default_rng(seed)
    mad = mad + 1e-4 * rng.standard_normal((layers, heads))
    return {"condition": condition, "seed": seed, "accuracy": accuracy, "layers": list(range(layers)),
            "mad": mad.tolist(), "mad_cls_at_zero": (mad * cls_factor).tolist(),
            "entropy": np.full((layers, heads), entropy).tolist(), "skipped": np.zeros((layers, heads)).tolist(),
            "num_images": 32, "num_prefix_tokens": 1, "grid_size": [8, 8], "patch_size": 4,
            "eval_subset": {"method": "class-stratified", "count": 32, "of": 1024, "seed": 0, "indices_sha1": "x"},
            "train_images": 500, "train_images_per_epoch": 384,  # --train-images 500, batch 128
            "train_config": study.train_config(condition, seed, "cpu").to_dict()}


def make_study(tmp_path, mad_with, accuracy_with, cls_factor=1.0):
    study = LocalityStudy(conditions=["baseline", "baseline+cutmix"], seeds=[0, 1], epochs=1, device="cpu",
                          out=str(tmp_path), progress=False)
    records = [record("baseline", s, 0.4178, 0.9999, 0.60 + 0.004 * s, study) for s in (0, 1)]
    records += [record("baseline+cutmix", s, mad_with, 0.9999 if mad_with > 0.4 else 0.3,
                       accuracy_with + 0.004 * s, study, cls_factor) for s in (0, 1)]
    write_results(study, records, dt.datetime.now(dt.UTC))
    return tmp_path


def test_two_conditions_judge_each_registry_claim_once(tmp_path):
    """Baseline against Baseline + CutMix: L4 (one pair) and L6-cutmix are judged, once each; the claims that need
    other conditions say which; nothing is filed twice."""
    results = LocalityResults.read(make_study(tmp_path, 0.01, 0.67))
    ids = [j.claim_id for j in results.claims]
    assert len(ids) == len(set(ids)) == 12
    measured = {j.claim_id for j in results.claims if j.difference is not None}
    assert measured == {"L4", "L6-cutmix"}
    assert {(j.a, j.b) for j in results.claims if j.difference is not None} == {
        ("conditions with cutmix", "conditions without cutmix"), ("baseline+cutmix", "baseline")}


def _section(text, start, end):
    return text[text.index(start):text.index(end)]


def test_report_of_a_null_result_says_so(tmp_path):
    text = build_report(make_study(tmp_path, 0.4176, 0.51)).read_text()
    verdicts = _section(text, "What this run shows", "Claims checked")
    # every condition attends uniformly: the separation cannot show (not testable); CutMix costs 9 points
    assert verdicts.count('class="not-reproduced">Not reproduced</b> <b>L6-cutmix</b>') == 1
    assert '<b class="not-testable">Not testable</b> <b>L4</b>' in verdicts
    assert "attends about uniformly" in verdicts and "attend almost uniformly" in verdicts
    assert "needs runs of modern and baseline" in verdicts  # the headline claims say what they need
    # the size beside the paper's, and the scale the verdict holds for beside the paper's
    assert "the opposite sign to the paper&#x27;s effect" in verdicts
    assert "Scale of this verdict</i>: vit-micro, 1 epoch, 2 seeds per condition, synthetic scenes" in verdicts
    assert "(the paper: compact ViT, CIFAR-100, one seed)" in verdicts
    assert "Power: these seeds detect effects of about" in verdicts
    table = _section(text, "Claims checked", "The readings the seed leaves open")
    assert table.count("<tr>") == 3  # header + L4 + L6-cutmix (the claims without their conditions are above)
    for column in ("claim", "test", "difference", "interval low", "interval high", "verdict"):
        assert f"<th>{column}</th>" in table, column
    for prose in ("size beside the paper&#x27;s", "power"):  # too wide for a column: a line under each row
        assert table.count(f"<div><b>{prose}</b>: ") == 2, prose
    readings = _section(text, "The readings the seed leaves open", "Claims not judged")
    assert "early = layers 1 and 2" in readings and "CLS counted at distance 0 in MAD" in readings
    unjudged = _section(text, "Claims not judged", "Summary per condition")
    assert all(f"<b>{cid}</b>" in unjudged for cid in ("L3", "L7", "L8", "L9"))
    assert "claim L3, not judged" in text  # the MAD-entropy figure is L3's
    assert "1 epochs" not in text and "1 epoch," in text
    assert "<td>min_lr</td><td>1e-05</td>" in text and "0.0000" not in text
    assert "<td>seed</td><td>per run: 0, 1</td>" in text and "None" not in text
    assert "<td>baseline+cutmix seed 1</td>" in text  # every run's settings
    assert "32 of 1024 (class-stratified, seed 0)" in text
    # the partial last batch is left out of each epoch: the report says how many images an epoch used
    assert "500 training images of which each epoch trains on 384 (full batches; the 116 left over" in text


def test_report_of_a_reproduced_effect(tmp_path):
    text = build_report(make_study(tmp_path, 0.01, 0.67)).read_text()
    verdicts = _section(text, "What this run shows", "Claims checked")
    assert verdicts.count("Reproduced</b>") == 2 and "attend almost uniformly" not in verdicts
    assert "the closest gap is" in verdicts and "against the paper's bounds" in verdicts


def test_report_says_when_the_readings_disagree(tmp_path):
    """CutMix's heads local only with CLS counted at distance 0 (a CLS sink): the verdict keeps the stated reading
    and one sentence says the other reads otherwise."""
    text = build_report(make_study(tmp_path, 0.40, 0.67, cls_factor=0.02)).read_text()
    verdicts = _section(text, "What this run shows", "Claims checked")
    item = verdicts[verdicts.index("<b>L4</b>"):]
    item = item[:item.index("</li>")]
    assert "Not testable" not in item.split("<b>L4</b>")[0]
    assert "<b>The readings the seed leaves open disagree: with CLS counted at distance 0 in MAD it reads " \
           "reproduced" in item


@pytest.fixture
def captured(monkeypatch):
    """The matplotlib figures the report functions would save."""
    saved = []

    def keep(fig, path):
        saved.append(fig)
        return path

    monkeypatch.setattr(figures, "save_figure", keep)
    yield saved
    matplotlib.pyplot.close("all")


def reference_lines(ax):
    return {round(float(line.get_ydata()[0]), 4) for line in ax.lines if len(set(line.get_ydata())) == 1} | {
        round(float(line.get_xdata()[0]), 4) for line in ax.lines if len(set(line.get_xdata())) == 1}


def test_axes_start_at_zero_and_show_uniform_references(captured, tmp_path):
    tiny = np.full((4, 4), 0.4178) + 1e-4 * np.arange(16).reshape(4, 4)  # noise around the uniform value
    figures.per_layer({"a": tiny}, "MAD", tmp_path / "m.png", reference=0.4178)
    figures.behaviour_space({"a": (tiny, np.full((4, 4), 0.9999))}, tmp_path / "b.png", uniform=0.4178)
    (mad_ax,) = captured[0].axes
    assert mad_ax.get_ylim()[0] == 0 and mad_ax.get_ylim()[1] > 0.4178 and 0.4178 in reference_lines(mad_ax)
    space = captured[1].axes[0]
    assert space.get_xlim()[0] == 0 and space.get_ylim() == (0, 1.05)
    assert {1.0, 0.4178} <= reference_lines(space)


def test_attention_maps_share_one_colour_scale_with_a_bar(captured, tmp_path):
    attn = torch.softmax(torch.randn(2, 65, 65), -1).numpy()
    figures.attention_examples(np.zeros((32, 32, 3)), {"layer 1": attn}, (8, 8), 1, tmp_path / "e.png",
                               title="baseline (seed 0), image 1", vmax=0.5)
    fig = captured[0]
    maps = [im for ax in fig.axes for im in ax.get_images() if im.get_array().shape == (8, 8)]
    assert len(maps) == 4 and {im.get_clim() for im in maps} == {(0.0, 0.5)}
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes) and fig._suptitle.get_text().startswith("baseline")
    assert not math.isnan(maps[0].get_array().max())


def test_crowded_heads_get_a_zoom_inset_that_holds_them_with_a_margin(captured, tmp_path):
    """Heads all near uniform attention fill an inset (data limits plus margin, the references marked), while the
    main axes keep 0 and the reference values; heads spread over the axes get no inset."""
    rng = np.random.default_rng(0)
    mad, ent = 0.41 + 0.004 * rng.standard_normal((8, 8)), 0.995 + 0.003 * rng.standard_normal((8, 8))
    spread = (rng.uniform(0, 0.4, (8, 8)), rng.uniform(0.2, 1, (8, 8)))
    figures.behaviour_space({"crowded": (mad, ent), "spread": spread}, tmp_path / "b.png", uniform=0.4178)
    crowded, wide = captured[0].axes[:2]
    assert crowded.get_xlim()[0] == 0 and crowded.get_ylim() == (0, 1.05) and {1.0, 0.4178} <= reference_lines(crowded)
    (inset,) = [child for child in crowded.child_axes if child.get_label() == "zoom"]
    for values, (low, high) in ((mad, inset.get_xlim()), (ent, inset.get_ylim())):
        span = values.max() - values.min()
        assert low < values.min() - 0.05 * span and values.max() + 0.05 * span < high  # a margin on each side
        assert span / (high - low) > 0.6  # the points fill the inset
    shown = np.concatenate([c.get_offsets() for c in inset.collections if len(c.get_offsets())])
    assert len(shown) == mad.size
    assert 0.4178 in reference_lines(inset)  # the uniform MAD falls inside the zoom and is marked
    assert not [child for child in wide.child_axes if child.get_label() == "zoom"]


def test_claims_table_keeps_its_power_line_readable(tmp_path):
    """The power line is prose: with 13 columns it cannot have a readable column of its own in the page, so it is
    a full-width line under its claim's row (report/html.py ``table``), named, after the verdict."""
    text = build_report(make_study(tmp_path, 0.4176, 0.51)).read_text()
    claims_html = text[text.index("Claims checked"):text.index("The readings the seed leaves open")]
    head = [c.split("</th>")[0] for c in claims_html.split("<th>")[1:]]
    assert "power" not in head and head[-1] == "verdict"
    rows = claims_html.split("<tr>")[2:]
    for row in rows:
        line = row[row.index('<tr class="prose">'):]
        assert line.startswith(f'<tr class="prose"><td colspan="{len(head)}"><div><b>')
        assert "<div><b>power</b>: " in line and "needs about" in line
    assert '<div class="wide"><table class="stacked">' in claims_html
    style = text[text.index("<style>"):text.index("</style>")]
    assert "td.long{min-width:22em;text-align:left}" in style and ".wide{overflow-x:auto}" in style
    assert "tr.prose td{" in style


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)")
def test_claims_table_power_line_is_wide_in_chromium(tmp_path):
    """Rendered at 1280 px: every power line is at least 20em wide and at most 6 lines tall, and the table ends
    inside the window."""
    sync_api = pytest.importorskip("playwright.sync_api")
    report = build_report(make_study(tmp_path, 0.4176, 0.51))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(report.as_uri())
        sizes, right = page.evaluate("""() => {
            const h2 = [...document.querySelectorAll('h2')].find(h => h.textContent === 'Claims checked');
            let table = h2.nextElementSibling; while (!table.querySelector('table')) table = table.nextElementSibling;
            const em = parseFloat(getComputedStyle(table.querySelector('td')).fontSize);
            const sizes = [...table.querySelectorAll('tr.prose td')].map(td => {
                const line = parseFloat(getComputedStyle(td).lineHeight) || em * 1.2;
                return [td.getBoundingClientRect().width / em, td.getBoundingClientRect().height / line];
            });
            return [sizes, table.querySelector('table').getBoundingClientRect().right];
        }""")
        page.screenshot(path=str(tmp_path / "claims.png"), full_page=True)
        browser.close()
    assert sizes and all(width >= 20 and lines <= 6 for width, lines in sizes), sizes
    assert right <= 1280


def test_every_time_estimate_names_its_machine():
    """'about 4 hours for the 24 runs' held only on a GPU (about 26 hours per run on this project's CPU): each
    paper-scale cost in the reports, and each time in the CLI's --help, says which machine it is for."""
    import re

    from vitscope.cli import build_parser
    from vitscope.report.openings import PAPER_SCALE

    machine = re.compile(r"GPU|CPU|cores?\b|H200|A100|V100")
    duration = re.compile(r"\b(hours?|minutes?|min|days?|weeks?)\b")
    for study, (_, cost) in PAPER_SCALE.items():
        assert machine.search(cost), f"{study}: {cost}"
    assert "H200" in PAPER_SCALE["locality"][1] and "26 hours per run" in PAPER_SCALE["locality"][1]
    timed = [text for text in _help_texts(build_parser()) if duration.search(text)]
    assert timed and all(machine.search(text) for text in timed), timed


def _help_texts(parser):
    """Every option's and subcommand's help text, through every level of subcommands."""
    import argparse

    for action in parser._actions:
        yield action.help or ""
        if isinstance(action, argparse._SubParsersAction):
            yield from (choice.help or "" for choice in action._choices_actions)
            for sub in action.choices.values():
                yield from _help_texts(sub)
