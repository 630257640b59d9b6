"""High-norm thresholds against numpy and known bimodal samples."""

import numpy as np
import pytest
import torch

from vitscope.metrics.norms import high_norm_threshold, parse_threshold, token_norms


def test_token_norms_are_l2():
    tokens = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]])
    assert token_norms(tokens).tolist() == [[5.0, 0.0]]
    with pytest.raises(ValueError, match="batch, tokens, dim"):
        token_norms(torch.zeros(3, 4))


def test_percentile_and_absolute():
    rng = np.random.default_rng(0)
    sample = torch.from_numpy(rng.lognormal(3, 0.4, size=5000)).float()
    assert high_norm_threshold(sample, "percentile:98").value == pytest.approx(np.percentile(sample.numpy(), 98),
                                                                               rel=1e-5)
    assert high_norm_threshold(sample, "absolute:150").value == 150.0


def test_auto_separates_artifact_tokens_from_normal_ones():
    rng = np.random.default_rng(1)
    normal = rng.lognormal(np.log(20), 0.2, size=2000)
    artifacts = rng.lognormal(np.log(300), 0.1, size=40)
    threshold = high_norm_threshold(torch.from_numpy(np.concatenate([normal, artifacts])).float(), "auto").value
    assert normal.max() < threshold < artifacts.min()
    # the geometric midpoint of the gap between the largest normal token and the smallest artifact
    assert threshold == pytest.approx(np.sqrt(normal.max() * artifacts.min()), rel=1e-5)


@pytest.mark.parametrize("spec", ["percentile:100", "percentile:x", "median", "absolute:"])
def test_bad_threshold_specs(spec):
    with pytest.raises(ValueError, match="percentile:Q"):
        parse_threshold(spec)
