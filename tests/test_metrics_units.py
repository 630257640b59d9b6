"""Per-image units and norm histograms, against loops written out by hand."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.metrics.norms import log_histograms
from vitscope.metrics.units import per_image, per_image_picked


@settings(max_examples=40, deadline=None)
@given(images=st.integers(1, 6), patches=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_per_image_picked_sums_and_counts_each_images_picked_patches(images, patches, seed):
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(images, patches, generator=generator)
    pick = torch.rand(images, patches, generator=generator) < 0.4
    expected = {"images": [], "sums": [], "counts": []}
    for i in range(images):  # by hand: one image at a time, empty images left out
        if pick[i].any():
            expected["images"].append(i)
            expected["sums"].append(sum(float(v) for v, p in zip(values[i], pick[i], strict=True) if p))
            expected["counts"].append(int(pick[i].sum()))
    got = per_image_picked(values, pick)
    assert got["images"] == expected["images"] and got["counts"] == expected["counts"]
    np.testing.assert_allclose(got["sums"], expected["sums"], rtol=1e-12, atol=1e-12)
    assert per_image(values[pick], pick.nonzero()[:, 0]) == got


def test_log_histograms_share_log_edges_and_count_every_token():
    norms = {"patch": [torch.tensor([[1.0, 10.0], [100.0, 1000.0]]), torch.tensor([[2.0, 3.0]])],
             "cls": [torch.tensor([5.0]), torch.empty(0)]}
    found = log_histograms(norms, [0, 1], bins=3)
    edges = np.asarray(found["edges"])
    assert edges[0] == 1.0 and np.allclose(np.diff(np.log10(edges)), np.log10(1000 * 1.001 + 1e-12) / 3)
    # edges 1, 10.003, 100.07, 1001: 10 and 100 sit just below the second and third edges
    assert found["counts"]["patch"] == {"0": [2, 1, 1], "1": [2, 0, 0]}
    assert found["counts"]["cls"] == {"0": [1, 0, 0]}  # the empty layer is left out
