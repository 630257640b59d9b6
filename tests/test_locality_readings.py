"""The second MAD reading the locality seed leaves open: CLS counted at distance 0 (the raw patch mass), streamed
beside the stated reading on every path, against a hand computation over the whole attention map; and the
readings of 'early layers'."""

import numpy as np
import pytest
import torch

import vitscope
from vitscope.attention import fast_paths, native
from vitscope.metrics import LocalityAccumulator
from vitscope.metrics.locality import grid_distances, mean_attention_distance
from vitscope.metrics.streaming import AttentionBatch, SoftmaxInputs
from vitscope.models import create
from vitscope.studies.locality import readings as rd
from vitscope.studies.locality.records import LocalityRun


def cls_at_zero_by_hand(attn: np.ndarray, grid=(8, 8)) -> np.ndarray:
    """(B, H) MAD over patch queries of sum over *all* keys of A d, with d(query, CLS) = 0: the full (65 x 65)
    distance matrix written out, no renormalisation, divided by the grid's largest patch distance."""
    gh, gw = grid
    centres = np.array([(r, c) for r in range(gh) for c in range(gw)], dtype=float)
    n = len(centres)
    full = np.zeros((n + 1, n + 1))
    full[1:, 1:] = np.sqrt(((centres[:, None] - centres[None]) ** 2).sum(-1))  # CLS row and column stay 0
    per_query = (attn * full).sum(-1)[..., 1:]  # patch queries only
    return per_query.mean(-1) / full.max()


def sinking_attention(batch=2, heads=3, seed=0) -> torch.Tensor:
    """Softmax rows over CLS + 64 patches, some heads sending most of their mass to CLS."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, heads, 65, 65, generator=gen, dtype=torch.float64) * 2
    logits[:, 0, :, 0] += 12.0  # head 1 sinks on CLS
    return logits.softmax(-1)


def accumulate(batch: AttentionBatch) -> LocalityAccumulator:
    acc = LocalityAccumulator()
    acc.update(0, batch)
    return acc


def test_cls_at_distance_zero_equals_the_hand_computation_on_maps():
    attn = sinking_attention()
    distances = grid_distances((8, 8))
    acc = accumulate(AttentionBatch(1, distances, 4, "g", lambda: attn))
    stats = acc.stats([0])
    want = cls_at_zero_by_hand(attn.numpy()).mean(0)  # mean over images, per head
    np.testing.assert_allclose(stats.mad_raw[0].numpy(), want, rtol=1e-5)
    # the stated reading is unchanged, and differs where a head sinks on CLS
    stated = mean_attention_distance(attn, (8, 8), num_prefix_tokens=1).mean(0)
    np.testing.assert_allclose(stats.mad[0].numpy(), stated.numpy(), rtol=1e-5)
    assert stats.mad_raw[0, 0] < 0.1 * stats.mad[0, 0]  # the sinking head reads near 0 with CLS at distance 0
    raw = mean_attention_distance(attn, (8, 8), num_prefix_tokens=1, renormalize=False).mean(0)
    np.testing.assert_allclose(stats.mad_raw[0].numpy(), raw.numpy(), rtol=1e-5)  # = renormalize=False


@pytest.mark.parametrize("use_native", [False, True])
def test_cls_at_distance_zero_from_queries_and_keys(use_native):
    if use_native and native.library() is None:
        pytest.skip("no working C++ compiler on this machine")
    torch.manual_seed(1)
    q, k = torch.randn(2, 2, 65, 8), torch.randn(2, 2, 65, 8)
    k[:, :, 0] *= 6  # a strong CLS key
    scale = 0.7
    probs = ((q.double() * scale) @ k.double().transpose(-2, -1)).softmax(-1)
    batch = AttentionBatch(1, grid_distances((8, 8)), 4, "g", lambda: probs.float(),
                           softmax_qk=SoftmaxInputs(q, k, scale))
    with fast_paths(native=use_native, compiled=False):
        stats = accumulate(batch).stats([0])
    np.testing.assert_allclose(stats.mad_raw[0].numpy(), cls_at_zero_by_hand(probs.numpy()).mean(0), rtol=1e-4)


def test_a_recorded_model_keeps_both_readings():
    torch.manual_seed(0)
    model, images = create("vit-micro").eval(), torch.randn(3, 3, 32, 32)
    with torch.no_grad(), vitscope.record_attention(model, keep="maps") as maps:
        model(images)
    with torch.no_grad(), vitscope.record_attention(model, keep="stats") as rec:
        model(images)
    for layer, attn in enumerate(maps.maps):
        want = cls_at_zero_by_hand(attn.double().numpy()).mean(0)
        np.testing.assert_allclose(rec.stats.mad_raw[layer].numpy(), want, rtol=1e-4, atol=1e-6)


def run(layers=4, cls0=True) -> LocalityRun:
    mad = np.arange(layers * 2, dtype=float).reshape(layers, 2) / 10
    return LocalityRun("baseline", 0, mad=mad.tolist(), entropy=np.ones((layers, 2)).tolist(),
                       mad_cls_at_zero=(mad / 2).tolist() if cls0 else None)


def test_the_readings_of_early_layers_and_mad():
    four = [run(4)]
    stated = rd.stated(4)
    assert stated.early == (0,) and stated.mad == "mad"  # the first quarter of 4 layers: layer 1
    names = [r.name(stated) for r in rd.others(four)]
    assert names == ["early = layers 1 and 2", "CLS counted at distance 0 in MAD",
                     "CLS counted at distance 0 in MAD and early = layers 1 and 2"]
    assert rd.min_early_mad(four[0], stated) == 0.0
    assert rd.min_early_mad(four[0], rd.Reading("mad_cls_at_zero", (1,), "")) == pytest.approx(0.1)
    # vit-compact's 8 layers: the first quarter is layers 1-2 already, so that reading is not repeated
    assert [r.name(rd.stated(8)) for r in rd.others([run(8)])] == ["CLS counted at distance 0 in MAD"]
    # a run measured before the second MAD was kept: only the layer reading, and the report says why
    assert [r.mad for r in rd.others([run(4), run(4, cls0=False)])] == ["mad"]
    assert "not recorded" in rd.unread([run(4, cls0=False)]) and rd.unread(four) == ""
    # layers the user names are the stated ones; both others are judged beside them
    named = rd.stated(8, [2, 3])
    assert named.early == (2, 3) and {r.early for r in rd.others([run(8)], [2, 3])} == {(0, 1), (2, 3)}
