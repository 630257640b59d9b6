"""The CLS + chosen-tokens image classifier (``probes.cls_with_tokens``, claim R9) on features with known answers."""

import numpy as np
import pytest
import torch

from vitscope.probes.cls_with_tokens import MIN_IMAGES, cls_with_tokens, masked_mean
from vitscope.probes.features import LayerFeatures

FIT = {"lrs": (0.1,), "weight_decays": (0.0,), "epochs": 60}


def features(cls, patches, registers=0):
    tokens = torch.cat([cls[:, None], patches], dim=1).half()
    return LayerFeatures(3, tokens, 1 + registers, registers, (2, 2), 16)


def test_masked_mean_is_the_mean_of_the_chosen_tokens():
    rng = np.random.default_rng(0)
    patches = torch.from_numpy(rng.normal(size=(5, 4, 3))).float()
    mask = torch.from_numpy(rng.random((5, 4)) < 0.5)
    mask[0] = False
    got = masked_mean(patches, mask, chunk=2)
    for i in range(5):
        want = patches[i][mask[i]].mean(0) if mask[i].any() else torch.zeros(3)
        assert torch.allclose(got[i], want, atol=1e-6)


def test_tokens_that_carry_the_class_add_to_a_cls_that_does_not():
    """CLS is noise, the chosen token holds the class: CLS + tokens near 1, CLS alone near chance, on the same
    held-out images (the images with a chosen token), each outcome per image."""
    rng = np.random.default_rng(1)
    n, classes = 200, 4
    labels = torch.from_numpy(rng.integers(0, classes, n))
    cls = torch.from_numpy(rng.normal(size=(n, 8))).float()
    patches = torch.from_numpy(rng.normal(size=(n, 4, 8))).float()
    patches[:, 2] = 0.0
    patches[torch.arange(n), 2, labels] = 5.0  # token 2 of every image names its class
    mask = torch.zeros(n, 4, dtype=torch.bool)
    mask[:, 2] = True
    mask[:20] = False  # twenty images without a chosen token
    rows = cls_with_tokens(features(cls, patches), labels, {"high-norm": mask}, label="m", fit_options=FIT)
    by = {(r["model"], r["group"]): r for r in rows}
    alone, both = by[("m", "cls (high-norm images)")], by[("m", "cls+high-norm")]
    assert alone["units"]["images"] == both["units"]["images"] and not set(alone["units"]["images"]) & set(range(20))
    assert both["value"] > 0.95 and alone["value"] < 0.5
    assert both["value"] == pytest.approx(np.mean(both["units"]["sums"]))
    assert by[("chance", "cls+high-norm")]["chance_for"] == "m"
    every = by[("m", "cls")]  # CLS alone on every held-out image, for the register pairs (R7)
    assert every["n"] > alone["n"] and set(alone["units"]["images"]) < set(every["units"]["images"])


def test_no_pair_without_enough_images_and_nothing_without_cls():
    rng = np.random.default_rng(2)
    labels = torch.from_numpy(rng.integers(0, 2, 40))
    cls, patches = torch.randn(40, 8), torch.randn(40, 4, 8)
    mask = torch.zeros(40, 4, dtype=torch.bool)
    mask[: MIN_IMAGES - 1, 0] = True  # too few images with a chosen token on either side
    groups = {r["group"] for r in cls_with_tokens(features(cls, patches), labels, {"high-norm": mask}, label="m",
                                                  fit_options=FIT)}
    assert groups == {"cls"}
    no_cls = LayerFeatures(3, patches.half(), 0, 0, (2, 2), 16)
    assert cls_with_tokens(no_cls, labels, {"high-norm": mask}, label="m") == []
