"""Claims judged on token-level rows (S2 across layers, R8 across token groups, R9 CLS against CLS + a group), the
class-evidence Point-in-Box score, and ``judge_estimate`` (a claim judged on an interval built elsewhere)."""

import numpy as np
import pytest
import torch

from vitscope.claims import claim
from vitscope.claims.judge import judge_estimate
from vitscope.data import synthetic_scenes
from vitscope.metrics.units import per_image, unit_values
from vitscope.models import create
from vitscope.probes.cls_with_tokens import cls_with_tokens
from vitscope.probes.features import LayerFeatures
from vitscope.probes.pib import pib_probe
from vitscope.probes.token_claims import judge_groups, judge_layers, judge_with_group, paired_units
from vitscope.stats import compare


def _row(layer: int, group: str, per_token: torch.Tensor, images: torch.Tensor, metric: str = "position_top1"):
    return {"model": "m", "layer": layer, "layer_kind": "token", "group": group, "metric": metric,
            "value": float(per_token.mean()), "n": len(per_token), "units": per_image(per_token, images)}


def test_unit_values_rebuild_each_images_sum_and_count():
    units = {"images": [3, 7], "sums": [2.0, 1.0], "counts": [4, 1]}
    values, images = unit_values(units)
    assert values.tolist() == [0.5] * 4 + [1.0] and images.tolist() == [3, 3, 3, 3, 7]


def test_layers_are_compared_image_by_image_with_the_cluster_robust_interval():
    generator = torch.Generator().manual_seed(0)
    images = torch.arange(20).repeat_interleave(6)
    shallow = (torch.rand(120, generator=generator) < 0.7).double()
    deep = (torch.rand(120, generator=generator) < 0.3).double()
    rows = [_row(3, "patch", shallow, images), _row(12, "patch", deep, images)]
    found = judge_layers(claim("S2-alignment"), rows, model="m", metric="position_top1", group="patch", a_layer=3,
                         b_layer=12, scope="planted")
    a, b, clusters = paired_units(rows[0], rows[1])
    reference = compare(a, b, sign=1, threshold=None, paired=True, clusters=clusters)
    assert found.difference == pytest.approx(float((shallow - deep).mean()))
    assert (found.ci95_low, found.ci95_high) == pytest.approx((reference.low, reference.high))
    assert found.verdict == "reproduced" and found.unit == "images" and found.n_a == 20
    assert {r["layer"] for r in found.rows} == {3, 12} and all("units" not in r for r in found.rows)
    flipped = judge_layers(claim("S2-alignment"), rows, model="m", metric="position_top1", group="patch",
                           a_layer=12, b_layer=3, scope="planted")
    assert flipped.verdict == "not reproduced"


def test_a_missing_layer_is_not_testable_with_the_reason():
    rows = [_row(3, "patch", torch.ones(4), torch.arange(4))]
    found = judge_layers(claim("S2-alignment"), rows, model="m", metric="position_top1", group="patch", a_layer=3,
                         b_layer=12, scope="planted")
    assert found.verdict == "not testable" and "layers 3 and 12" in found.reason


def test_groups_are_compared_with_each_side_clustered_by_image():
    generator = torch.Generator().manual_seed(1)
    images = torch.arange(30).repeat_interleave(4)
    high = torch.rand(120, generator=generator) + 1.0  # worse pixel reconstruction: R8-local's direction
    rest = torch.rand(120, generator=generator)
    rows = [_row(12, "top-norm", high, images, "pixels_mse"), _row(12, "rest", rest, images, "pixels_mse")]
    found = judge_groups(claim("R8-local"), rows, model="m", metric="pixels_mse", layer=12, a_group="top-norm",
                         b_group="rest", scope="planted")
    (a, ia), (b, ib) = unit_values(rows[0]["units"]), unit_values(rows[1]["units"])
    reference = compare(a, b, sign=1, threshold=None, clusters=(ia, ib))
    assert found.verdict == "reproduced" and found.ci95_low == pytest.approx(reference.low)


def test_r9_judged_on_cls_with_tokens_rows_gives_the_planted_verdict():
    """CLS is noise and the group names the class (cls_with_tokens fitted on planted features): the gain is far past
    R9's one-point margin, not reproduced; the interval pairs the same held-out images."""
    rng = np.random.default_rng(4)
    n, classes = 240, 4
    labels = torch.from_numpy(rng.integers(0, classes, n))
    cls = torch.from_numpy(rng.normal(size=(n, 8))).float() * 0.01
    patches = torch.from_numpy(rng.normal(size=(n, 4, 8))).float() * 0.01
    patches[:, 2] = torch.nn.functional.one_hot(labels, 8).float() * 5
    mask = torch.zeros(n, 4, dtype=torch.bool)
    mask[:, 2] = True
    feats = LayerFeatures(12, torch.cat([cls[:, None], patches], 1).half(), 1, 0, (2, 2), 16)
    rows = cls_with_tokens(feats, labels, {"top-norm": mask}, label="m",
                           fit_options={"lrs": (0.1,), "weight_decays": (0.0,), "epochs": 60})
    found = judge_with_group(claim("R9"), rows, model="m", group="top-norm", scope="planted; stand-in group")
    assert found.verdict == "not reproduced", found.reason
    assert found.n_a == 120 and found.layer == 12 and "stand-in" in found.scope and found.rows
    assert found.difference == pytest.approx(0.75, abs=0.15)  # near 1 against chance (1/4)
    assert judge_with_group(claim("R9"), rows, model="other", group="top-norm", scope="s").verdict == "not testable"


def _outcome_row(group: str, right: np.ndarray) -> dict:
    images = list(range(len(right)))
    return {"model": "m", "layer": 12, "layer_kind": "token", "group": group, "metric": "image_top1",
            "value": float(right.mean()), "n": len(right),
            "units": {"images": images, "sums": right.tolist(), "counts": [1] * len(right)}}


@pytest.mark.parametrize("flips, verdict", [(4, "reproduced"), (200, "not reproduced")])
def test_r9_equivalence_on_planted_outcomes(flips, verdict):
    """3000 held-out images, CLS right on 80 %; the group's classifier differs on 4 images each way (no change,
    within one top-1 point: reproduced) or is right on 200 more (+6.7 points: not reproduced)."""
    alone = np.r_[np.ones(2400), np.zeros(600)]
    both = alone.copy()
    both[:4] = 0
    both[2400:2404] = 1
    both[2404 : 2400 + flips] = 1
    rows = [_outcome_row("cls (top-norm images)", alone), _outcome_row("cls+top-norm", both)]
    found = judge_with_group(claim("R9"), rows, model="m", group="top-norm", scope="planted")
    assert found.verdict == verdict, found.reason
    assert found.difference == pytest.approx((both - alone).mean())


def test_judge_estimate_applies_the_one_rule_with_the_claims_direction_or_a_given_sign():
    s3 = claim("S3")
    up = judge_estimate(s3, 2.0, 0.5, 3.5, method="jackknife", n_a=60, n_b=60, scope="here", layer=4)
    assert up.verdict == "reproduced" and up.layer == 4 and up.scope == "here" and up.unit == "images"
    assert judge_estimate(s3, -2.0, -3.5, -0.5, method="m", n_a=60).verdict == "not reproduced"
    assert judge_estimate(s3, 2.0, -0.5, 3.5, method="m", n_a=60).verdict == "inconclusive"
    # depth: lower RMSE is better, so a negative with-minus-without is the claim's direction
    assert judge_estimate(s3, -0.1, -0.2, -0.05, method="m", n_a=60, sign=-1).verdict == "reproduced"
    with pytest.raises(ValueError, match="equivalence"):
        judge_estimate(claim("R9"), 0.0, -0.1, 0.1, method="m", n_a=10)


@pytest.mark.parametrize("where, expected", [("object", 100.0), ("background", 0.0)])
def test_class_evidence_pib_finds_a_planted_class_patch_and_scores_the_held_out_half(where, expected):
    """A backbone whose patch tokens on the object (or, the other way, only those off it) carry the image class
    (planted by a hook), the others only the random backbone's mixing: the class-evidence map peaks where the class
    was planted, PiB is 100 (or 0), and the rows give one unit per held-out image (in percent), half the images."""
    from vitscope.metrics.pib import centres_in_boxes

    torch.manual_seed(3)
    scenes = synthetic_scenes("eval", num_images=40, cue="shape")
    model = create("vit-micro").eval()
    on_object = centres_in_boxes(scenes.extras["boxes"], (8, 8), 4).float()  # (images, 64)
    if where == "background":
        on_object = 1 - on_object
    code = torch.nn.functional.one_hot(scenes.labels, 64).float() * 50

    def plant(_module, _inputs, output):  # one batch holds every image (batch_size=40), in dataset order
        output = output.clone()
        output[:, 1:] += on_object[: len(output), :, None] * code[: len(output), None]
        return output

    model.blocks[3].register_forward_hook(plant)
    result = pib_probe(model, scenes, "4", score="class", batch_size=40, cache=False, progress=False,
                       baseline=False, norm=False)
    row = next(r for r in result.rows if r["model"] == "model" and r["metric"] == "pib")
    assert row["value"] == expected and row["n"] == 20 and result.settings["scored_images"] == 20
    assert set(row["units"]["sums"]) == {expected} and row["units"]["counts"] == [1] * 20
    chance = next(r for r in result.rows if r["model"] == "chance" and r["metric"] == "pib")["value"]
    assert 0 < chance < 100
    assert np.isclose(row["value"], np.mean(row["units"]["sums"]))
