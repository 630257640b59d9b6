"""The synthetic scene generator: deterministic, consistent dense targets."""

import pytest
import torch

from vitscope.data import SHAPES, eval_batches, load_dataset, synthetic_scenes


def test_deterministic_and_independent_of_count():
    a = synthetic_scenes("train", 12, seed=3)
    b = synthetic_scenes("train", 5, seed=3)
    assert torch.equal(a.images[:5], b.images) and torch.equal(a.labels[:5], b.labels)
    c = synthetic_scenes("train", 5, seed=4)
    assert not torch.equal(b.images, c.images)
    assert not torch.equal(synthetic_scenes("eval", 5, seed=3).images, b.images)


def test_shapes_and_targets_agree():
    data = synthetic_scenes("eval", 40, image_size=32, num_classes=8)
    assert data.images.shape == (40, 3, 32, 32) and data.images.dtype == torch.uint8
    assert data.num_classes == 8 and data.classes == list(SHAPES)
    masks, boxes, depth = data.extras["masks"], data.extras["boxes"], data.extras["depth"]
    for i in range(40):
        ys, xs = torch.nonzero(masks[i], as_tuple=True)
        assert len(ys) > 0
        assert set(masks[i].unique().tolist()) == {0, int(data.labels[i]) + 1}
        assert boxes[i].tolist() == [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
        # the object stands nearer than the ground behind it
        assert depth[i][masks[i] > 0].mean() < depth[i][masks[i] == 0].mean()
    assert len(data.labels.unique()) > 4


def test_load_dataset_entry_point_and_batches():
    data = load_dataset("synthetic", None, "test", num_images=10)
    assert data.split == "eval" and len(data) == 10
    batches = list(eval_batches(data, 4))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert batches[0][0].dtype == torch.float32 and abs(float(batches[0][0].mean())) < 1.0
    with pytest.raises(ValueError, match="use 'train' or 'eval'"):
        load_dataset("synthetic", None, "holdout")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("mnist", None, "train")
    with pytest.raises(ValueError, match="classes"):
        synthetic_scenes("train", 4, num_classes=20)


def test_texture_cue_puts_the_class_in_the_texture_and_not_in_the_colour():
    """cue='texture': the object's texture is the class (the amplitude spectrum, blind to colour and position,
    recovers it at twice chance or better, and better than the object's mean colour, which only knows the
    patterns' fill fraction), the objects are grey (no per-image colour for self-supervision to match views
    by) on a coloured background, one in every quadrant (so every crop shows the class), and the masks mark
    them."""
    from vitscope.metrics.knn import knn_top1

    train = synthetic_scenes("train", 768, cue="texture")
    test = synthetic_scenes("eval", 256, cue="texture")
    assert train.classes[0] == "stripes-4px" and len(set(train.classes)) == 8
    masks = test.extras["masks"]
    assert all(set(masks[i].unique().tolist()) == {0, int(test.labels[i]) + 1} for i in range(len(test)))
    red, green, blue = test.images.unbind(1)
    inside = masks > 0
    assert torch.equal(red[inside], green[inside]) and torch.equal(red[inside], blue[inside])
    assert (red[~inside] != green[~inside]).float().mean() > 0.5  # the background keeps its colours
    quadrants = inside.unflatten(1, (2, 16)).unflatten(3, (2, 16)).float().mean((2, 4))  # (N, 2, 2) coverage
    assert quadrants.min() > 0.2, quadrants.min()
    greys = torch.tensor([len(red[i][inside[i]].unique()) for i in range(len(test))])  # one object: 2 levels
    assert (greys >= 6).float().mean() > 0.9, greys  # four objects, each with its own dark and light grey

    def spectrum(data):  # the grey image's amplitude spectrum: blind to colour, phase and position
        return torch.fft.rfft2(data.images.float().mean(1) / 255).abs().flatten(1)

    def colour(data):
        inside = (data.extras["masks"] > 0).unsqueeze(1)
        return (data.images.float() * inside).sum((2, 3)) / inside.sum((2, 3))

    by_texture = knn_top1(spectrum(train), train.labels, spectrum(test), test.labels, 8, k=20, temperature=0.07)
    by_colour = knn_top1(colour(train), train.labels, colour(test), test.labels, 8, k=20, temperature=0.07)
    assert by_texture > 2 / 8 and by_texture > by_colour, (by_texture, by_colour)
    with pytest.raises(ValueError, match="cue='outline' is unknown"):
        synthetic_scenes("eval", 2, cue="outline")
