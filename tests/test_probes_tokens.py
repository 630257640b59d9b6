"""Token probes against known answers: positions, pixels and class planted where the probe must find them."""

import pytest
import torch

from vitscope.data import ImageDataset, synthetic_scenes
from vitscope.models import create
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
    assert result.value(0, "patch", "position_top1", model="chance") == pytest.approx(1 / 64)
    # the mean distance between two uniformly drawn cells of an 8x8 grid
    assert result.value(0, "patch", "position_distance", model="chance") == pytest.approx(4.1365, abs=1e-4)


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
