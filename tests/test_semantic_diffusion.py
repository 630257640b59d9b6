"""Semantic diffusion on features built so that the answer is known, and its geometry against brute force."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.data import synthetic_scenes
from vitscope.metrics.diffusion import background_cls_cosine, background_patches
from vitscope.models import create
from vitscope.probes.diffusion import dataset_background, diffusion_scores, semantic_diffusion
from vitscope.probes.features import LayerFeatures

FAST_FIT = {"lrs": (0.1,), "weight_decays": (0.0,), "epochs": 60}


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 5), height=st.integers(4, 30), width=st.integers(4, 30),
       data=st.data())
def test_background_from_boxes_matches_brute_force(rows, cols, height, width, data):
    coords = st.floats(-2, 32, allow_nan=False)
    boxes = torch.tensor([[data.draw(coords) for _ in range(4)] for _ in range(3)]).reshape(1, 3, 4)
    boxes[0, 2] = float("nan")  # a padding row never covers anything
    got = background_patches((rows, cols), (height, width), boxes=boxes)[0]
    for r in range(rows):
        for c in range(cols):
            y, x = (r + 0.5) * height / rows, (c + 0.5) * width / cols
            inside = any(b[0] <= x < b[2] and b[1] <= y < b[3] for b in boxes[0, :2].tolist())
            assert bool(got[r * cols + c]) == (not inside)


def test_background_from_masks_reads_each_patch_centre():
    mask = torch.zeros(1, 8, 8, dtype=torch.uint8)
    mask[0, 4:, 4:] = 3  # object in the bottom-right quarter
    mask[0, 0:2, 6:8] = 255  # an ignored region is not background
    got = background_patches((4, 4), (8, 8), masks=mask)[0].reshape(4, 4)
    expected = torch.ones(4, 4, dtype=torch.bool)
    expected[2:, 2:] = False
    expected[0, 3] = False
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="masks or boxes"):
        background_patches((4, 4), (8, 8))


def test_synthetic_scene_background_excludes_the_object():
    data = synthetic_scenes("eval", num_images=8)
    background = dataset_background(data, (8, 8))
    for n in range(len(data)):
        mask = data.extras["masks"][n]
        for p in range(64):
            y, x = (p // 8) * 4 + 2, (p % 8) * 4 + 2  # centre of a 4-pixel patch on the 32-pixel image
            assert bool(background[n, p]) == (int(mask[y, x]) == 0)


def test_cosine_with_cls_known_values():
    cls = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    patches = torch.tensor([[[3.0, 0.0], [0.0, 1.0], [-1.0, 0.0]],   # cos 1, 0, -1
                            [[1.0, 1.0], [0.0, 5.0], [0.0, 1.0]]])   # cos 1/sqrt2, 1, 1
    background = torch.tensor([[True, True, False], [True, False, False]])
    got = background_cls_cosine(patches, cls, background)
    assert got[0].item() == pytest.approx(0.5)
    assert got[1].item() == pytest.approx(1 / math.sqrt(2))
    none = background_cls_cosine(patches, cls, torch.zeros(2, 3, dtype=torch.bool))
    assert none.isnan().all()


def _planted_features(leaky: bool, images: int = 96, classes: int = 4, grid: int = 4, dim: int = 16, seed: int = 0):
    """Features where background tokens carry the image class and lie along CLS (leaky) or carry noise
    orthogonal to CLS (clean); foreground tokens always carry the class, so a probe that read them would
    score 1 in both cases."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(images) % classes
    patches = grid * grid
    background = torch.ones(images, patches, dtype=torch.bool)
    background[:, :3] = False  # three object patches per image
    class_code = torch.eye(classes, dim // 2) * 4.0
    cls = torch.zeros(images, dim)
    cls[:, : dim // 2] = class_code[labels]
    tokens = torch.zeros(images, 1 + patches, dim)
    tokens[:, 0] = cls
    noise = torch.randn(images, patches, dim // 2, generator=g)
    if leaky:
        scale = torch.rand(images, patches, 1, generator=g) + 0.5
        tokens[:, 1:, : dim // 2] = class_code[labels][:, None, :] * scale
    else:
        tokens[:, 1:, dim // 2 :] = noise  # orthogonal to CLS, independent of the class
    tokens[:, 1:4, : dim // 2] = class_code[labels][:, None, :]
    tokens[:, 1:4, dim // 2 :] = 0
    feats = LayerFeatures(layer=1, tokens=tokens.half(), num_prefix_tokens=1, num_registers=0, grid=(grid, grid),
                          patch_size=4)
    return feats, labels, background


def test_leaky_background_tokens_score_full_top1_and_cosine_one():
    feats, labels, background = _planted_features(leaky=True)
    scores = diffusion_scores(feats, labels, background, fit_options=FAST_FIT)
    assert scores["top1"] == 1.0
    assert scores["cosine"] == pytest.approx(1.0, abs=1e-3)
    assert scores["chance"] == pytest.approx(0.25, abs=0.05)
    assert scores["held_tokens"] == 48 * 13  # every background token of the held-out half


def test_clean_background_tokens_score_chance_and_cosine_zero():
    feats, labels, background = _planted_features(leaky=False)
    scores = diffusion_scores(feats, labels, background, fit_options=FAST_FIT)
    assert scores["top1"] < 0.4  # chance is 0.25; the foreground tokens (which carry the class) are not read
    assert scores["cosine"] == pytest.approx(0.0, abs=1e-6)


def test_probe_on_a_model_has_model_random_and_chance_rows(tmp_path):
    data = synthetic_scenes("eval", num_images=24)
    result = semantic_diffusion(create("vit-micro"), data, "0,last", max_tokens=128, cache=tmp_path, progress=False,
                                fit_options=FAST_FIT)
    models = {r["model"] for r in result.rows}
    assert models == {"model", "model (random init)", "chance"}
    for layer in (0, 4):
        top1 = result.value(layer=layer, metric="diffusion_top1")
        cosine = result.value(layer=layer, metric="diffusion_cosine")
        assert 0.0 <= top1 <= 1.0 and -1.0 <= cosine <= 1.0
    assert result.settings["background_patches"] == int(dataset_background(data, (8, 8)).sum())
    no_masks = synthetic_scenes("eval", num_images=4)
    no_masks.extras.clear()
    with pytest.raises(ValueError, match="masks or boxes"):
        semantic_diffusion(create("vit-micro"), no_masks, "last", baseline=False, cache=False, progress=False)


def test_the_sweep_holds_out_whole_images_so_image_identity_scores_chance():
    """Tokens that carry only their image's identity (no class signal): a sweep that split one image's tokens
    between its fit and validation parts would read the class off the memorised identity (0.7-1.0); holding out
    whole images leaves it at chance (1 / classes)."""
    images, classes, patches, dim = 160, 8, 16, 64
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(images) % classes
    identity = torch.randn(images, 1, dim, generator=g) * 3.0
    tokens = torch.cat([torch.zeros(images, 1, dim), identity + 0.1 * torch.randn(images, patches, dim, generator=g)],
                       1)
    feats = LayerFeatures(layer=1, tokens=tokens, num_prefix_tokens=1, num_registers=0, grid=(4, 4), patch_size=4)
    background = torch.ones(images, patches, dtype=torch.bool)
    scores = diffusion_scores(feats, labels, background,
                              fit_options={"lrs": (0.03, 0.3), "weight_decays": (0.0,), "epochs": 40})
    sweep = scores["fit"]["sweep"]
    assert scores["fit"]["val_split"] == "groups" and len(sweep) == 2
    assert max(point["val_top1"] for point in sweep) < 2.5 / classes  # chance 1/8, validation on 16 images
    assert scores["top1"] < 2.5 / classes  # held-out images: identity says nothing of the class
