"""Token probes against known answers: positions, pixels and class planted where the probe must find them."""

import numpy as np
import pytest
import torch

from vitscope.data import ImageDataset, synthetic_scenes
from vitscope.models import create
from vitscope.probes.baselines import best_constant_distance, majority_top1
from vitscope.probes.linear import fit_classifier, group_split
from vitscope.probes.tokens import probe_tokens

FAST = {"lrs": (0.05,), "weight_decays": (0.0,), "epochs": 60}


@pytest.fixture(scope="module")
def scenes():
    return synthetic_scenes("train", num_images=40)


def test_position_is_read_from_a_learned_positional_embedding(scenes):
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2)
    with torch.no_grad():
        model.pos_embed.normal_(std=1.0)  # a learned table that dominates the embedding, as after training
    result = probe_tokens(model, scenes, "0", probes=("position",), norm=False, baseline=False, cache=False,
                          progress=False, fit_options=FAST)
    assert result.value(0, "patch", "position_top1") >= 0.97
    assert result.value(0, "patch", "position_distance") < 0.1
    # the best constant guess on (nearly) uniform positions: one of the 64 cells, and a central cell's 3.09 patches
    # (not a uniformly random guess's 4.14)
    assert 0 < result.value(0, "patch", "position_top1", model="chance") < 3 / 64
    assert result.value(0, "patch", "position_distance", model="chance") == pytest.approx(3.09, abs=0.1)


def test_position_chance_is_the_best_constant_guess():
    ys, xs = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    cells = np.stack([ys.ravel(), xs.ravel()], 1)
    distances = np.sqrt(((cells[:, None] - cells[None]) ** 2).sum(-1))  # brute force, patch units
    every = torch.arange(64)
    assert best_constant_distance(every, every, torch.from_numpy(distances)) == pytest.approx(3.0939, abs=1e-4)
    assert distances.mean(1).min() == pytest.approx(3.0939, abs=1e-4) and distances.mean() == pytest.approx(4.1365,
                                                                                                                abs=1e-4)
    corner = torch.zeros(10, dtype=torch.long)  # every fitting token in cell 0: guess cell 0
    assert best_constant_distance(corner, torch.tensor([0, 63]), torch.from_numpy(distances)) == pytest.approx(
        distances[0, 63] / 2)
    assert majority_top1(torch.tensor([5, 5, 3]), torch.tensor([5, 1, 2, 5])) == 0.5  # the most frequent position


def test_token_sweeps_hold_out_whole_images():
    images = torch.arange(40).repeat_interleave(10)  # 10 tokens from each of 40 images
    fit, held = group_split(images, 0.2, seed=0)
    assert len(held) == 80 and not set(images[fit].tolist()) & set(images[held].tolist())
    clf = fit_classifier(torch.randn(400, 4), torch.randint(0, 3, (400,)), 3, lrs=(0.1, 0.01), weight_decays=(0.0,),
                         epochs=2, groups=images)
    assert clf.settings["val_split"] == "groups"


def test_patch_rows_carry_per_image_units(scenes):
    torch.manual_seed(0)
    model = create("vit-micro")
    result = probe_tokens(model, scenes, "0", probes=("position", "class"), norm=False, baseline=False, cache=False,
                          progress=False, fit_options=FAST)
    for metric in ("position_top1", "position_distance", "class_top1"):
        found = [r for r in result.rows if r["model"] == "model" and r["group"] == "patch" and r["metric"] == metric]
        assert len(found) == 1, found
        units = found[0]["units"]
        assert sum(units["counts"]) == found[0]["n"] and len(units["images"]) < found[0]["n"]
        assert sum(units["sums"]) / sum(units["counts"]) == pytest.approx(found[0]["value"])


def test_pixels_are_recovered_exactly_from_a_wide_patch_embedding(scenes):
    torch.manual_seed(1)
    model = create("vit-micro")  # width 64 >= 3 * 4 * 4 = 48 pixel values per patch
    with torch.no_grad():
        model.pos_embed.zero_()  # the patch embedding before positions are added
    result = probe_tokens(model, scenes, "0,1", probes=("pixels", "pixels-mlp"), norm=False, baseline=False,
                          cache=False, progress=False, max_tokens=512)
    assert result.value(0, "patch", "pixels_mse") < 1e-4
    chance = result.value(0, "patch", "pixels_mse", model="chance")
    assert chance > 0.1 and result.value(1, "patch", "pixels_mse") > 10 * result.value(0, "patch", "pixels_mse")
    assert result.value(0, "patch", "pixels_mlp_mse") < 0.5 * chance
    assert result.value(0, "patch", "pixels_mlp_mse", model="chance") == chance


def test_class_is_read_only_from_the_token_that_carries_it():
    """Flat images whose colour is the class (black, red, green, blue): every patch carries it at layer 0, the
    CLS token and the register cannot."""
    labels = torch.arange(4).repeat(16)
    colours = torch.tensor([[0, 0, 0], [200, 0, 0], [0, 200, 0], [0, 0, 200]], dtype=torch.uint8)
    images = colours[labels].view(-1, 3, 1, 1).expand(-1, 3, 32, 32).contiguous()
    flat = ImageDataset("flat", "train", images, labels, list("abcd"), (0.5,) * 3, (0.25,) * 3)
    torch.manual_seed(2)
    model = create("vit-micro", num_registers=1)
    high = torch.zeros(64, 64, dtype=torch.bool)
    high[:, :5] = True
    result = probe_tokens(model, flat, "0", probes=("class", "position"), norm=False, cache=False, progress=False,
                          patch_groups={"high-norm": high}, fit_options=FAST)
    for group in ("patch", "patch-mean", "high-norm"):
        assert result.value(0, group, "class_top1") == 1.0
    majority = result.value(0, "cls", "class_top1", model="chance")
    assert result.value(0, "cls", "class_top1") == pytest.approx(majority, abs=0.15)
    assert result.value(0, "register0", "class_top1") == pytest.approx(majority, abs=0.15)
    # every patch group has the same size: the smallest group's (5 tokens x 32 held-out images)
    sizes = {row["n"] for row in result.rows if row["metric"] == "position_top1"}
    assert sizes == {160}
    assert {"model (random init)", "chance"} <= {row["model"] for row in result.rows}
    assert not any(row["group"].startswith("register") and row["metric"].startswith(("position", "pixels"))
                   for row in result.rows)


def test_bad_patch_mask_names_the_expected_shape(scenes):
    with pytest.raises(ValueError, match=r"\(40, 64\)"):
        probe_tokens(create("vit-micro"), scenes, "0", probes=("class",), patch_groups={"x": torch.ones(3, 3)},
                     baseline=False, cache=False, progress=False, fit_options=FAST)


def test_fit_and_held_images_are_class_balanced():
    from vitscope.probes.tokens import balanced

    labels = torch.tensor([0] * 10 + [1] * 4 + [2] * 6)
    kept = balanced(torch.arange(20), labels, seed=0)
    assert labels[kept].bincount().tolist() == [4, 4, 4]
    assert torch.equal(kept, balanced(torch.arange(20), labels, seed=0))


def test_a_settings_object_and_keyword_options_probe_the_same(scenes):
    from vitscope.probes.tokens import TokenProbeSettings

    torch.manual_seed(0)
    model = create("vit-micro")
    quick = TokenProbeSettings(probes=("position", "class"), norm=False, baseline=False, cache=False,
                               progress=False, fit_options=FAST, max_tokens=256)
    by_object = probe_tokens(model, scenes, "0", quick)
    by_keywords = probe_tokens(model, scenes, "0", probes=("position", "class"), norm=False, baseline=False,
                               cache=False, progress=False, fit_options=FAST, max_tokens=256)
    assert by_object.rows == by_keywords.rows and by_object.settings == by_keywords.settings
    assert probe_tokens(model, scenes, "0", quick, probes=("class",)).settings["probes"] == ["class"]  # override
    with pytest.raises(TypeError, match=r"unknown options \['max_token'\]"):
        probe_tokens(model, scenes, "0", quick, max_token=3)
    with pytest.raises(ValueError, match="unknown token probes"):
        TokenProbeSettings(probes=("colour",))


def test_a_one_class_folder_gets_no_class_top1_that_cannot_tell_a_model_from_chance():
    """One class: the model, its random twin and the majority guess all score class top-1 1.0, which says nothing.
    The class probe is left out and said so (the local probes still run); asked for alone, it is refused."""
    one_class = synthetic_scenes("train", num_images=16)
    one_class = ImageDataset("one-class", "eval", one_class.images, torch.zeros(16, dtype=torch.long), ["street"],
                             one_class.mean, one_class.std)
    model = create("vit-micro")
    result = probe_tokens(model, one_class, "0", probes=("position", "class"), norm=False, cache=False,
                          progress=False, fit_options=FAST, max_tokens=128)
    assert not [r for r in result.rows if r["metric"] == "class_top1"]
    assert {r["model"] for r in result.rows if r["metric"] == "position_top1"} == {
        "model", "model (random init)", "chance"}
    assert result.settings["probes"] == ["position"]
    assert "two or more classes" in result.settings["not_measured"]["class"]
    with pytest.raises(ValueError, match="two or more classes.*'one-class' gives 1 and 1.*position,pixels"):
        probe_tokens(model, one_class, "0", probes=("class",), baseline=False, cache=False, progress=False,
                     fit_options=FAST)


def test_an_empty_patch_group_gets_no_rows_instead_of_an_error(scenes):
    """A model with no high-norm tokens (a random timm ViT in the registers demo) hands an empty group: its chance
    level was 'a chance level needs examples on both sides (got 0 to fit and 0 held out)' and the demo exited 2."""
    none = torch.zeros(len(scenes), 64, dtype=torch.bool)
    rows = probe_tokens(create("vit-micro"), scenes, "0", probes=("position", "class"), patch_groups={"none": none},
                        fit_options=FAST, baseline=False, cache=False, progress=False).rows
    assert not [r for r in rows if r["group"] == "none"]
    assert {r["group"] for r in rows} >= {"patch", "cls"}
    assert {r["n"] for r in rows if r["group"] == "cls"} != {2}  # the empty group did not shrink the images
