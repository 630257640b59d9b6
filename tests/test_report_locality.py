"""The locality report's honesty: verdicts with a threshold, each comparison once, references on every
MAD/entropy axis, shared colour scale, every run's settings; built from hand-made results (no training)."""

import datetime as dt
import math

import matplotlib
import numpy as np
import pytest
import torch

from vitscope.report import figures
from vitscope.report.locality import build_report
from vitscope.studies.locality import LocalityStudy, write_results
from vitscope.studies.locality_results import claims
from vitscope.studies.locality_verdicts import distinct, judge


def test_uniform_mad_matches_the_definition():
    assert figures.uniform_mad((8, 8)) == pytest.approx(0.4178, abs=5e-5)
    assert figures.uniform_mad((8, 8), "patch") == pytest.approx(4.1365, abs=5e-5)
    ys, xs = np.meshgrid(np.arange(3), np.arange(5), indexing="ij")  # brute force on a 3 x 5 grid
    pts = np.stack([ys.ravel(), xs.ravel()], 1)
    d = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    assert figures.uniform_mad((3, 5), "pixel", 16) == pytest.approx(d.mean() * 16)


def claim(measure, difference, low, high, name="conditions with cutmix vs without", runs=3):
    return {"claim": name, "measure": measure, "with": 0.5 + difference, "without": 0.5, "difference": difference,
            "ci95_low": low, "ci95_high": high, "runs_with": runs, "runs_without": runs}


@pytest.mark.parametrize(("measure", "difference", "low", "high", "verdict"), [
    ("min_early_mad", -0.30, -0.35, -0.25, "reproduced"),
    ("min_early_mad", -0.0002, -0.0003, -0.0001, "not reproduced"),  # interval excludes zero, effect negligible
    ("min_early_mad", 0.05, 0.01, 0.09, "not reproduced"),  # the other way
    ("min_early_mad", -0.15, -0.30, 0.01, "inconclusive"),
    ("min_early_mad", -0.12, -0.20, -0.05, "reproduced"),  # past the threshold, interval excludes zero
    ("min_early_mad", -0.08, -0.11, -0.05, "inconclusive"),  # short of the threshold, interval reaches it
    ("accuracy", 0.07, 0.05, 0.09, "reproduced"),
    ("accuracy", -0.09, -0.09, -0.09, "not reproduced"),  # CutMix costing 9 points
])
def test_verdicts_against_the_threshold(measure, difference, low, high, verdict):
    judged = judge(claim(measure, difference, low, high))
    assert judged["verdict"] == verdict and judged["threshold"] in (0.1, 0.03)


def test_claims_without_a_paper_claim_get_no_verdict():
    judged = judge(claim("min_early_mad", -0.3, -0.4, -0.2, name="conditions with labelsmoothing vs without"))
    assert judged["verdict"] == "no paper claim"


def record(condition, seed, mad, entropy, accuracy, study):
    layers, heads = 4, 4
    rng = np.random.default_rng(seed)
    return {"condition": condition, "seed": seed, "accuracy": accuracy, "layers": list(range(layers)),
            "mad": (mad + 1e-4 * rng.standard_normal((layers, heads))).tolist(),
            "entropy": np.full((layers, heads), entropy).tolist(), "skipped": np.zeros((layers, heads)).tolist(),
            "num_images": 32, "num_prefix_tokens": 1, "grid_size": [8, 8], "patch_size": 4,
            "eval_subset": {"method": "class-stratified", "count": 32, "of": 1024, "seed": 0, "indices_sha1": "x"},
            "train_config": study.train_config(condition, seed, "cpu").to_dict()}


def make_study(tmp_path, mad_with, accuracy_with):
    study = LocalityStudy(conditions=["baseline", "baseline+cutmix"], seeds=[0, 1], epochs=1, device="cpu",
                          out=str(tmp_path), progress=False)
    records = [record("baseline", s, 0.4178, 0.9999, 0.60, study) for s in (0, 1)]
    records += [record("baseline+cutmix", s, mad_with, 0.9999 if mad_with > 0.4 else 0.3, accuracy_with, study)
                for s in (0, 1)]
    write_results(study, records, dt.datetime.now(dt.UTC))
    return tmp_path


def test_two_conditions_give_each_comparison_once(tmp_path):
    results = make_study(tmp_path, 0.4176, 0.51)
    import json

    payload = json.loads((results / "results.json").read_text())
    merged = distinct(payload["claims"])
    assert len(payload["claims"]) == 4 and len(merged) == 2  # with/without == cutmix alone, per measure
    assert merged[0]["same_as"] == ["baseline+cutmix vs baseline (cutmix alone)"]
    assert len(distinct(claims(payload["runs"]))) == 2


def test_report_of_a_null_result_says_so(tmp_path):
    text = build_report(make_study(tmp_path, 0.4176, 0.51)).read_text()
    verdicts = text[text.index("What this run shows"):text.index("Claims checked")]
    assert verdicts.count("Not reproduced</b>") == 2  # MAD unchanged, CutMix costs 9 points
    assert "at least 0.1 (normalised MAD)" in verdicts and "attend almost uniformly" in verdicts
    table = text[text.index("Claims checked"):text.index("Summary per condition")]
    assert table.count("<tr>") == 3  # header + one row per measure
    assert "1 epochs" not in text and "1 epoch," in text
    assert "<td>min_lr</td><td>1e-05</td>" in text and "0.0000" not in text
    assert "<td>seed</td><td>per run: 0, 1</td>" in text and "None" not in text
    assert "<td>baseline+cutmix seed 1</td>" in text  # every run's settings
    assert "32 of 1024 (class-stratified, seed 0)" in text


def test_report_of_a_reproduced_effect(tmp_path):
    text = build_report(make_study(tmp_path, 0.01, 0.67)).read_text()
    verdicts = text[text.index("What this run shows"):text.index("Claims checked")]
    assert verdicts.count("Reproduced</b>") == 2 and "attend almost uniformly" not in verdicts


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
