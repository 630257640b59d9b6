"""The registers findings on hand-made rows: comparisons need held-out tokens and an image-clustered interval, and
every finding says whether it agrees with the paper."""

import numpy as np
import pytest

from vitscope.studies.registers.findings import MIN_HELD_OUT, findings, group_comparison


def artifact_rows(model, layer=4):
    """A separate high-norm mode at ``layer``: 5 % of patches above 5x the median norm."""
    return [{"model": model, "layer": layer, "layer_kind": "token", "group": "patch", "metric": "high_norm_fraction",
             "threshold": "auto", "threshold_value": 10.0, "value": 0.05, "n": 6400},
            {"model": model, "layer": layer, "layer_kind": "token", "group": "patch", "metric": "norm_median",
             "value": 2.0, "n": 6400}]


def probe_row(model, group, metric, per_image, layer=4):
    """A probe row whose held-out outcomes are ``per_image``: a list of per-token value lists, one per image."""
    sums = [float(np.sum(v)) for v in per_image]
    counts = [len(v) for v in per_image]
    return {"model": model, "layer": layer, "layer_kind": "token", "group": group, "metric": metric,
            "value": sum(sums) / sum(counts), "n": sum(counts),
            "units": {"images": list(range(len(per_image))), "sums": sums, "counts": counts}}


MODELS = [{"label": "vit", "planted": None, "parameters": 5_000_000}]


def by_finding(rows, models=MODELS):
    return {f["finding"]: f for f in findings(rows, models)}


def test_two_held_out_tokens_are_no_evidence():
    # old: position 0.5 vs 1.0 and class 1.0 vs 0.5 on 2 tokens each read "global: reproduced"
    rows = artifact_rows("vit") + [
        probe_row("vit", "high-norm", "position_top1", [[0.0], [1.0]]),
        probe_row("vit", "normal", "position_top1", [[1.0], [1.0]]),
        probe_row("vit", "high-norm", "class_top1", [[1.0], [1.0]]),
        probe_row("vit", "normal", "class_top1", [[0.0], [1.0]])]
    found = by_finding(rows)["global"]
    assert found["verdict"] == "inconclusive" and found["agrees"] == "undecided"
    assert f"needs >= {MIN_HELD_OUT} in each group" in found["evidence"]


def test_a_clear_difference_on_many_images_is_reproduced_with_an_image_interval():
    rng = np.random.default_rng(0)
    high_pos = [list((rng.random(4) < 0.1).astype(float)) for _ in range(40)]
    normal_pos = [list((rng.random(4) < 0.8).astype(float)) for _ in range(40)]
    high_cls = [[1.0] * 4 if rng.random() < 0.9 else [0.0] * 4 for _ in range(40)]
    normal_cls = [[1.0] * 4 if rng.random() < 0.5 else [0.0] * 4 for _ in range(40)]
    rows = artifact_rows("vit") + [
        probe_row("vit", "high-norm", "position_top1", high_pos), probe_row("vit", "normal", "position_top1",
                                                                            normal_pos),
        probe_row("vit", "high-norm", "class_top1", high_cls), probe_row("vit", "normal", "class_top1", normal_cls)]
    found = by_finding(rows)["global"]
    assert found["verdict"] == "reproduced" and found["agrees"] == "agrees"
    assert "cluster-robust t over images" in found["evidence"] and "40 vs 40 images" in found["evidence"]
    result, _ = group_comparison(rows, "vit", 4, "class_top1")
    # whole images right or wrong: the image interval is wider than one that treats the 160 tokens as independent
    naive = 1.96 * np.sqrt(sum(np.var(np.ravel(g)) / 160 for g in (high_cls, normal_cls)))
    assert (result.high - result.low) / 2 > 1.5 * naive


def test_background_compares_local_variance_by_image():
    rows = artifact_rows("vit") + [
        probe_row("vit", "high-norm", "patch_local_variance", [[0.10, 0.12]] * 20),
        probe_row("vit", "normal", "patch_local_variance", [[0.9, 1.1, 1.0]] * 10 + [[0.95, 1.05, 1.0]] * 10)]
    found = by_finding(rows)["background"]
    assert found["verdict"] == "reproduced", found["evidence"]


def test_clean_small_models_alone_leave_the_large_model_claim_undecided():
    rows = [{"model": "vit", "layer": 4, "layer_kind": "token", "group": "patch", "metric": "high_norm_fraction",
             "threshold": "auto", "threshold_value": 3.0, "value": 0.0, "n": 6400}]
    exist = by_finding(rows)["exist"]
    # the small-model half agrees, but the paper's main claim (large models grow artifacts) was never measured
    assert exist["verdict"] == "inconclusive" and exist["agrees"] == "undecided"  # before: "reproduced"
    assert "no small model" in exist["evidence"] and "no large model measured" in exist["evidence"]
    small = [{"label": "vit", "planted": None, "parameters": 5_000_000}]
    rows_with = artifact_rows("vit")  # a small model with a high-norm mode: evidence against, large or not
    assert by_finding(rows_with, small)["exist"]["verdict"] == "not reproduced"
    large = [{"label": "vit", "planted": None, "parameters": 300_000_000}]
    assert by_finding(rows, large)["exist"]["verdict"] == "not reproduced"  # a large model without artifacts


@pytest.mark.parametrize("missing", ["units", "normal"])
def test_rows_without_units_or_a_group_are_not_evidence(missing):
    high = probe_row("vit", "high-norm", "position_top1", [[0.0] * 4] * 10)
    normal = probe_row("vit", "normal", "position_top1", [[1.0] * 4] * 10)
    if missing == "units":
        del high["units"]
    rows = artifact_rows("vit") + [high] + ([normal] if missing == "units" else [])
    result, why = group_comparison(rows, "vit", 4, "position_top1")
    assert result is None and why
