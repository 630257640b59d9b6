"""Batched augmentations with per-image randomness, and protocol names."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.data import augment, synthetic_scenes
from vitscope.data.autoaugment import AutoAugment
from vitscope.train.protocols import ABLATION, Protocol, canonical_protocol, expand_conditions, soft_cross_entropy


@pytest.fixture(scope="module")
def batch():
    data = synthetic_scenes("train", 64)
    return data.images, data.labels


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_random_crop_offsets_differ_per_image_and_match_padding(batch):
    images, _ = batch
    same = images[:1].expand(16, -1, -1, -1).clone()
    out = augment.random_crop(same, 4, gen())
    assert out.shape == same.shape
    assert len({bytes(o.numpy()) for o in out}) > 4  # different crops of the same image
    # every crop is a window of the zero-padded image
    padded = torch.nn.functional.pad(same[0], (4,) * 4)
    windows = {bytes(padded[:, y:y + 32, x:x + 32].contiguous().numpy()) for y in range(9) for x in range(9)}
    assert all(bytes(o.numpy()) in windows for o in out)


def test_flip_is_per_image(batch):
    images, _ = batch
    out = augment.random_flip(images, gen())
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, images, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out, images, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True)) and 10 < sum(flipped) < 54


def test_autoaugment_gives_images_of_one_batch_different_operations(batch):
    images, _ = batch
    aa = AutoAugment("cifar10")
    out = aa(images, gen(3))
    applied = aa.applied()
    assert len({tuple(name for name, _ in ops) for ops in applied}) > 5
    # an image whose operations were drawn as none is returned untouched; others changed
    assert all(torch.equal(out[i], images[i]) for i, ops in enumerate(applied) if not ops)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert torch.equal(out, aa(images, gen(3)))  # reproducible from the generator


def test_device_autoaugment_equals_torchvision_per_image_for_the_same_draw():
    """Each image gets exactly what torchvision's operations give it for its drawn sub-policy, firing and
    signs (what the previous host-grouped code applied), over every operation of the CIFAR-10 policy."""
    images = synthetic_scenes("train", 256).images
    aa = AutoAugment("cifar10")
    tv, seen = aa._tv, set()
    for seed in range(2):
        out = aa(images, gen(seed))
        for i, ops in enumerate(aa.applied()):
            expected = images[i:i + 1]
            for name, magnitude in ops:
                expected = tv._apply_image_or_video_transform(expected, name, magnitude,
                                                              interpolation=tv.interpolation, fill=tv._fill)
                seen.add((name, magnitude < 0))
            assert torch.equal(out[i], expected[0]), (i, ops)
    names = {name for name, _ in seen}
    assert names >= {"ShearY", "TranslateX", "TranslateY", "Rotate", "Color", "Contrast", "Sharpness", "Posterize",
                     "Solarize", "AutoContrast", "Equalize", "Invert", "Brightness"}
    assert ("Rotate", True) in seen and ("Rotate", False) in seen  # both signs
    # the CUDA path (every kind on the whole batch, selected by torch.where) gives the same images
    assert torch.equal(AutoAugment("cifar10", branch_free=True)(images, gen(1)), out)


def test_autoaugment_draw_frequencies_follow_the_policy():
    aa = AutoAugment("cifar10")
    choice, fire, negative = aa.draw(20000, gen(5), torch.device("cpu"))
    counts = torch.bincount(choice, minlength=len(aa.policies)).float()
    assert (counts / 20000 - 1 / len(aa.policies)).abs().max() < 0.01
    probs = torch.tensor([[p[slot][1] for slot in (0, 1)] for p in aa.policies])[choice]
    fired = (fire <= probs).float().mean(0)
    assert fired.tolist() == pytest.approx(probs.mean(0).tolist(), abs=0.01)
    assert float(negative.float().mean()) == pytest.approx(0.5, abs=0.01)


def test_color_jitter_factors_are_per_image(batch):
    images, _ = batch
    x = images[:1].expand(8, -1, -1, -1).float() / 255
    out = augment.color_jitter(x, gen())
    assert out.min() >= 0 and out.max() <= 1
    assert len({round(float(o.mean()), 5) for o in out}) == 8


def test_cutmix_box_area_sets_lambda_and_targets(batch):
    images, labels = batch
    x = images.float()
    targets = augment.one_hot_targets(labels, 8, smoothing=0.1)
    torch.testing.assert_close(targets.sum(1), torch.ones(64))
    assert targets.max() == pytest.approx(0.9 + 0.1 / 8) and targets.min() == pytest.approx(0.1 / 8)
    mixed, mixed_targets, lam = augment.cutmix(x, targets, gen(1))
    pasted = (mixed != x).any(dim=1)[0]  # pixels taken from the partner image
    changed_area = float(((mixed[0] == x.flip(0)[0]).all(0) & (x[0] != x.flip(0)[0]).any(0)).sum()) / (32 * 32)
    assert float(pasted.float().mean()) <= 1 - float(lam) + 1e-6
    assert changed_area == pytest.approx(1 - float(lam), abs=0.05)
    torch.testing.assert_close(mixed_targets, float(lam) * targets + (1 - float(lam)) * targets.flip(0))


def previous_cutmix(images, targets, lam: float, cy: int, cx: int):
    """The previous host-side CutMix for a fixed draw: Python-int box, slicing, lambda as a float."""
    h, w = images.shape[-2:]
    ratio = math.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
    x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
    mixed = images.clone()
    mixed[..., y0:y1, x0:x1] = images.flip(0)[..., y0:y1, x0:x1]
    lam = 1.0 - (y1 - y0) * (x1 - x0) / float(h * w)
    return mixed, lam * targets + (1 - lam) * targets.flip(0), lam


@given(lam=st.floats(0.0, 1.0), cy=st.integers(0, 31), cx=st.integers(0, 31))
@settings(max_examples=200, deadline=None)
def test_device_cutmix_box_equals_the_previous_slicing_for_a_fixed_draw(lam, cy, cx):
    images = torch.arange(4 * 3 * 32 * 32, dtype=torch.float32).reshape(4, 3, 32, 32)
    targets = augment.one_hot_targets(torch.tensor([0, 1, 2, 3]), 4, smoothing=0.1)
    expected_images, expected_targets, expected_lam = previous_cutmix(images, targets, lam, cy, cx)
    box, corrected = augment.cutmix_box(torch.tensor(lam, dtype=torch.float64), torch.tensor(cy), torch.tensor(cx),
                                        32, 32)
    assert float(corrected) == expected_lam
    assert torch.equal(torch.where(box, images.flip(0), images), expected_images)
    assert torch.equal(corrected.float() * targets + (1 - corrected).float() * targets.flip(0), expected_targets)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    values = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_cutmix_lambda_and_box_follow_the_previous_distribution(alpha):
    """lambda ~ Beta(alpha, alpha) (the previous code drew it with numpy) and box centres uniform over the
    image, over many batches: two-sample KS against numpy's Beta and a uniform histogram."""
    n, generator = 3000, gen(11)
    x, t = torch.zeros(2, 1, 32, 32), torch.zeros(2, 2)
    lams, centres = [], []
    for _ in range(n):
        lams.append(float(augment._beta(alpha, generator)))
        centres.append(int(torch.randint(0, 32, (), generator=generator)))
    reference = np.random.default_rng(0).beta(alpha, alpha, n)
    assert ks_statistic(np.array(lams), reference) < 1.95 * math.sqrt(2 / n)  # 0.1 % level
    counts = np.bincount(centres, minlength=32)
    assert counts.min() > n / 32 * 0.6 and counts.max() < n / 32 * 1.4
    _, _, lam = augment.cutmix(x, t, generator, alpha)
    assert lam.dtype == torch.float64 and 0 <= float(lam) <= 1


def test_protocol_names_and_ablation_grid():
    assert ABLATION == ("baseline", "baseline+autoaugment", "baseline+cutmix", "baseline+labelsmoothing",
                        "modern-labelsmoothing", "modern-cutmix", "modern-autoaugment", "modern")
    assert canonical_protocol("baseline+cutmix+labelsmoothing") == "modern-autoaugment"
    assert canonical_protocol("modern-cutmix-autoaugment") == "baseline+labelsmoothing"
    assert canonical_protocol("baseline+labelsmoothing+cutmix+autoaugment") == "modern"
    assert expand_conditions("ablation") == list(ABLATION)
    assert expand_conditions("baseline, modern,baseline") == ["baseline", "modern"]
    with pytest.raises(ValueError, match="unknown component 'mixup'"):
        canonical_protocol("baseline+mixup")
    with pytest.raises(ValueError, match="must start with"):
        canonical_protocol("fancy")


def test_protocol_output_and_soft_loss(batch):
    images, labels = batch
    modern = Protocol("modern", 8, (0.5,) * 3, (0.2,) * 3)
    x, t = modern(images, labels, gen())
    assert x.dtype == torch.float32 and t.shape == (64, 8)
    torch.testing.assert_close(t.sum(1), torch.ones(64))
    base = Protocol("baseline", 8, (0.5,) * 3, (0.2,) * 3)
    _, hard = base(images, labels, gen())
    assert torch.equal(hard.argmax(1), labels) and hard.max() == 1
    logits = torch.randn(64, 8)
    torch.testing.assert_close(soft_cross_entropy(logits, hard), torch.nn.functional.cross_entropy(logits, labels))


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), classes=st.integers(2, 12), seed=st.integers(0, 2**31 - 1),
       scale=st.floats(0.1, 30.0), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_soft_cross_entropy_equals_the_hand_written_formula(batch, classes, seed, scale, dtype):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, classes, generator=generator) * scale).to(dtype)
    targets = torch.rand(batch, classes, generator=generator) ** 3  # peaked, mixed and smoothed-like rows
    targets = targets / targets.sum(dim=-1, keepdim=True)
    by_hand = torch.sum(-targets * torch.log_softmax(logits.float(), dim=-1), dim=-1).mean()  # the old formula
    assert soft_cross_entropy(logits, targets).dtype == torch.float32
    torch.testing.assert_close(soft_cross_entropy(logits, targets), by_hand, rtol=1e-5, atol=1e-5)
