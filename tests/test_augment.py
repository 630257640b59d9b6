"""Batched augmentations with per-image randomness, and protocol names."""

import pytest
import torch

from vitscope.data import augment, synthetic_scenes
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
    aa = augment.AutoAugment("cifar10")
    out = aa(images, gen(3))
    ops = [tuple(name for name, _ in applied) for applied in aa.applied]
    assert len(set(ops)) > 5
    # an image whose operations were drawn as none is returned untouched; others changed
    untouched = [i for i, applied in enumerate(aa.applied) if not applied]
    assert all(torch.equal(out[i], images[i]) for i in untouched)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    again = aa(images, gen(3))
    assert torch.equal(out, again)  # reproducible from the generator


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
    assert pasted.float().mean() <= 1 - lam + 1e-6
    assert changed_area == pytest.approx(1 - lam, abs=0.05)
    torch.testing.assert_close(mixed_targets, lam * targets + (1 - lam) * targets.flip(0))


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
