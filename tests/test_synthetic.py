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
