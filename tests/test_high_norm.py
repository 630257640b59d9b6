"""High-norm token location and attention metrics against brute-force loops and hand-computed answers."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.metrics.high_norm import (
    attention_mass,
    high_norm_mask,
    mass_on_high_norm,
    patch_in_boxes,
    patch_object_fraction,
    patch_statistics,
    region_share,
)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 10_000))
def test_patch_statistics_match_a_loop_over_patches(batch, gh, gw, patch, seed):
    rng = np.random.default_rng(seed)
    images = rng.uniform(size=(batch, 3, gh * patch, gw * patch)).astype(np.float32)
    mean, var = patch_statistics(torch.from_numpy(images), (gh, gw))
    gray = images.mean(axis=1)
    for b in range(batch):
        for r in range(gh):
            for c in range(gw):
                block = gray[b, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch]
                assert mean[b, r * gw + c] == pytest.approx(block.mean(), abs=1e-5)
                assert var[b, r * gw + c] == pytest.approx(block.var(), abs=1e-5)


def test_object_fraction_and_boxes_by_hand():
    masks = torch.zeros(1, 4, 4, dtype=torch.uint8)
    masks[0, :2, :2] = 3  # the top-left patch of a 2x2 grid is all object
    masks[0, 2, 2] = 1  # one pixel of four in the bottom-right patch
    assert patch_object_fraction(masks, (2, 2)).tolist() == [[1.0, 0.0, 0.0, 0.25]]
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0]])  # covers only the centre (1, 1) of the top-left patch
    assert patch_in_boxes(boxes, (2, 2), (4, 4)).tolist() == [[True, False, False, False]]
    two = torch.tensor([[[0.0, 0.0, 1.0, 1.0], [2.5, 2.5, 4.0, 4.0]]])  # first misses every centre
    assert patch_in_boxes(two, (2, 2), (4, 4)).tolist() == [[False, False, False, True]]
    with pytest.raises(ValueError, match="multiple of the patch grid"):
        patch_object_fraction(masks, (3, 3))


def test_high_norm_mask_drops_prefix_tokens():
    norms = torch.tensor([[500.0, 400.0, 1.0, 9.0, 2.0]])  # CLS and a register far above the threshold
    assert high_norm_mask(norms, 5.0, prefix=2).tolist() == [[False, True, False]]
    with pytest.raises(ValueError, match="prefix"):
        high_norm_mask(norms, 5.0, prefix=5)


def test_region_share_known_answer():
    high = torch.tensor([[True, True, False, False], [False, True, False, False]])
    on_object = torch.tensor([[True, False, False, False], [True, True, True, True]])
    share = region_share(high, on_object)
    assert share == {"background_share_high": 1 / 3, "background_share_all": 3 / 8, "count_high": 3}
    assert np.isnan(region_share(torch.zeros_like(high), on_object)["background_share_high"])


def test_attention_mass_on_planted_attention():
    # 1 prefix token + 4 patches; every query puts 0.7 on patch 2 (token 3) and 0.3 on CLS
    probs = torch.zeros(2, 3, 5, 5)
    probs[..., 3] = 0.7
    probs[..., 0] = 0.3
    high = torch.tensor([[False, False, True, False], [False, False, False, True]])
    mass = mass_on_high_norm(probs, high, prefix=1)
    assert mass["cls"].tolist() == pytest.approx([0.7, 0.0])
    assert mass["patch"].tolist() == pytest.approx([0.7, 0.0])
    assert mass["share"].tolist() == pytest.approx([0.2, 0.2])
    keys = torch.tensor([[True, False, False, True, False]] * 2)
    assert torch.allclose(attention_mass(probs, keys), torch.ones(2, 3, 5))
    with pytest.raises(ValueError, match="batch, keys"):
        attention_mass(probs, keys[:, :3])


def test_separate_mode_needs_a_small_population_far_above_the_median():
    from vitscope.metrics.high_norm import separate_mode

    rng = np.random.default_rng(0)
    tail = torch.tensor(rng.lognormal(3.0, 0.3, 5000))  # one distribution: its upper tail is no mode
    one = separate_mode(tail)
    assert not one.separate and one.gap_iqr < 1.0  # its largest upper-tail gap is narrow
    assert "no separate high-norm mode" in one.describe()
    outliers = tail.clone()
    outliers[:100] = 20.0 * float(tail.median())  # 2 % of tokens at 20x the median: a population of their own
    two = separate_mode(outliers)
    assert two.separate and two.fraction == pytest.approx(0.02) and two.ratio >= 2.0 and two.gap_iqr > 1.0
    assert two.describe().startswith("a separate high-norm mode")


def test_analyze_norms_says_what_the_threshold_means_and_tests_for_a_separate_mode(tmp_path, capsys):
    """percentile:98 marks 2 % by construction, and a random vit-micro has no separate mode: the output says both
    rather than reading '2.02 % high-norm tokens' as a finding."""
    import json

    from vitscope.cli import main

    common = ["analyze", "norms", "--model", "vit-micro", "--num-images", "8", "--batch-size", "8", "--device", "cpu"]
    assert main([*common, "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "98th percentile" in out and "marks 2% of them by construction" in out
    assert "layer 4: no separate high-norm mode" in out
    saved = json.loads((tmp_path / "p" / "norms.json").read_text())
    assert saved["separate_mode"]["separate"] is False and "by construction" in saved["threshold"]["meaning"]
    assert main([*common, "--threshold", "auto", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "whether or not the gap is wide" in out and "no separate high-norm mode" in out
    saved = json.loads((tmp_path / "a" / "norms.json").read_text())
    assert [x["separate_mode"] for x in saved["layers"]] == [False] * 4  # each layer tested on its own norms
