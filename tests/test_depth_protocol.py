"""The depth protocol behind DINOv2's numbers: the bin head's 'linear' normalisation and NYU's Eigen crop default."""

import pytest
import torch

from vitscope.data.dense import synthetic_dense
from vitscope.models import create
from vitscope.probes.dense.bin_norm import bin_weights, depth_from_bins
from vitscope.probes.dense.probe import dense_probe
from vitscope.probes.dense.settings import DenseProbeSettings


def test_linear_normalisation_is_relu_plus_a_tenth_over_the_sum():
    logits = torch.tensor([-1.0, 0.0, 1.0])[None, :, None, None]  # (B, bins, H, W)
    weights = bin_weights(logits, "linear")[0, :, 0, 0]
    assert weights.tolist() == pytest.approx([0.1 / 1.3, 0.1 / 1.3, 1.1 / 1.3])
    assert bin_weights(logits, "softmax")[0, :, 0, 0].tolist() == pytest.approx(torch.tensor([-1.0, 0, 1]).softmax(0)
                                                                                 .tolist())
    depth = depth_from_bins(logits, torch.tensor([1.0, 2.0, 3.0]))
    assert float(depth) == pytest.approx((0.1 * 1 + 0.1 * 2 + 1.1 * 3) / 1.3)
    with pytest.raises(ValueError, match="'cosine' is unknown"):
        bin_weights(logits, "cosine")


def test_a_set_that_asks_for_the_eigen_crop_is_scored_inside_it():
    torch.manual_seed(0)
    train, held = synthetic_dense("depth", "train", 8), synthetic_dense("depth", "eval", 4)
    held.settings["eigen_crop"] = True  # what the NYU loader records
    quick = DenseProbeSettings(with_cls=(False,), epochs=1, baseline=False, cache=False, progress=False)
    result = dense_probe(create("vit-micro"), train, held, "last", quick)
    assert result.settings["eigen_crop"] is True and result.settings["bin_norm"] == "linear"
    off = dense_probe(create("vit-micro"), train, held, "last", quick.replace(eigen_crop=False))
    assert off.settings["eigen_crop"] is False
