"""The high-norm census: planted outliers found exactly where planted; registers kept out of the patch grid and
the thresholds; hierarchical models per stage."""

import numpy as np
import pytest
import torch

from vitscope.data import synthetic_scenes
from vitscope.models import create, load
from vitscope.models.own.planted import plant_outliers
from vitscope.record import record_tokens
from vitscope.studies.models import ModelEntry, parse_model_entries, parse_model_entry
from vitscope.studies.registers.census import CensusSettings, run_census


def lowest_variance_patches(images: np.ndarray, patch: int, count: int) -> np.ndarray:
    """Brute force: per image, the ``count`` patches with the lowest variance of the channel-mean pixels."""
    out = []
    for image in images:
        gray = image.mean(axis=0)
        side = gray.shape[0] // patch
        var = [gray[r * patch : (r + 1) * patch, c * patch : (c + 1) * patch].var()
               for r in range(side) for c in range(side)]
        out.append(sorted(np.argsort(var, kind="stable")[:count]))
    return np.array(out)


def rows_of(census, metric, **match):
    return [r for r in census.rows if r["metric"] == metric and all(r.get(k) == v for k, v in match.items())]


@pytest.mark.parametrize("planted_block", [0, 2])
def test_planted_outliers_are_found_exactly_at_the_planted_layer(planted_block):
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2).eval()
    data = synthetic_scenes("eval", num_images=24)
    settings = CensusSettings(thresholds=["auto"], attention_images=8, example_images=24)
    with plant_outliers(model, layer=planted_block, count=3, scale=30.0) as planted:
        census = run_census(model, data, "planted", settings, progress=False)
    fractions = {r["layer"]: r["value"] for r in rows_of(census, "high_norm_fraction")}
    first = planted_block + 1  # token layer numbering: block b (0-based) outputs token layer b + 1
    assert all(fractions[layer] == 0.0 for layer in range(first))
    assert all(fractions[layer] == pytest.approx(3 / 64) for layer in range(first, 5))
    # the high-norm patches at the detection layer are exactly the planted ones, chosen from the images
    found = census.tensors["high_norm_maps"].flatten(1).bool()
    expected = torch.zeros_like(found)
    expected.scatter_(1, planted.positions[:24], True)
    assert torch.equal(found, expected)
    pixels = census.tensors["images"].numpy()
    brute = lowest_variance_patches(pixels, 4, 3)
    assert np.array_equal(np.sort(planted.positions[:24].numpy(), axis=1), brute)
    variance = {r["group"]: r["value"] for r in rows_of(census, "patch_local_variance", layer=4)}
    assert variance["high-norm"] < variance["normal"]
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))


def test_registers_are_excluded_from_the_patch_grid_and_thresholds():
    torch.manual_seed(1)
    model = create("vit-micro", num_registers=4).eval()
    with torch.no_grad():
        model.reg_token.mul_(0).add_(50.0)  # registers with norms far above every patch token
    data = synthetic_scenes("eval", num_images=16)
    census = run_census(model, data, "regs", CensusSettings(thresholds=["percentile:90", "absolute:100"],
                                                           attention_images=4), progress=False)
    with torch.no_grad(), record_tokens(model, keep="norms") as rec:
        from vitscope.data import eval_batches

        for images, _ in eval_batches(data, 16):
            model(images)
    patch_norms = rec.norms[-1][:, 5:]
    expected = float(torch.quantile(patch_norms.double().flatten(), 0.90))
    assert census.thresholds[0]["value"] == pytest.approx(expected, rel=1e-6)
    assert census.tokens["registers"] == [1, 2, 3, 4] and census.tokens["patches"]["start"] == 5
    register_norm = rows_of(census, "norm_mean", group="register", layer=4)[0]["value"]
    assert register_norm > 100  # the registers exceed the absolute threshold ...
    absolute = rows_of(census, "high_norm_fraction", layer=4, threshold="absolute:100")[0]
    assert absolute["value"] == 0.0 and absolute["n"] == 16 * 64  # ... and are never counted as patches
    assert census.tensors["norm_maps"].shape == (8, 8, 8)


def test_hierarchical_models_get_one_threshold_per_stage():
    torch.manual_seed(0)
    model = load("timm:pvt_v2_b0").eval()
    data = synthetic_scenes("eval", num_images=4)
    census = run_census(model, data, "pvt", CensusSettings(thresholds=["percentile:95"], img_size=64),
                        progress=False)
    stages = sorted({t["stage"] for t in census.thresholds})
    assert stages == [1, 2, 3, 4]
    fraction = rows_of(census, "high_norm_fraction")
    for threshold in census.thresholds:  # the stage's own detection block sits at its 95th percentile
        at_detection = [r for r in fraction if r["layer"] == threshold["detection_layer"]][0]
        assert at_detection["value"] == pytest.approx(0.05, abs=0.02)
        assert at_detection["stage"] == threshold["stage"]
    mass = rows_of(census, "attention_mass_on_high_norm")  # on the reduced key grid, one row per block
    assert [r["stage"] for r in mass] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(r["keys"] == "reduced grid" and 0 <= r["value"] <= 1 for r in mass)


def test_model_entries_parse_and_refuse_bad_forms():
    entry = parse_model_entry("dino=timm:vit_small_patch16_224@/w/dino.safetensors")
    assert entry == ModelEntry("dino", "timm:vit_small_patch16_224", "/w/dino.safetensors")
    assert parse_model_entry("mine=runs/x").weights is None
    for bad in ("no-label", "=timm:x", "a=@w", "a b=vit-micro"):
        with pytest.raises(ValueError, match="LABEL|label|SPEC"):
            parse_model_entry(bad)
    with pytest.raises(ValueError, match="more than once"):
        parse_model_entries(["a=vit-micro", "a=vit-tiny"])
