"""Locality metrics against analytic values (docs/definitions.md)."""

import math

import hypothesis.extra.numpy as hnp
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.metrics import attention_entropy, grid_distances, mean_attention_distance

GRID = (8, 8)
UNIFORM_MAD_PATCHES = 4.1365  # the reference value for an 8x8 grid in docs/definitions.md


def with_prefix(patch_attn: torch.Tensor, prefix: int, prefix_mass: float = 0.0) -> torch.Tensor:
    """Embed (B, H, N, N) patch attention into (B, H, P+N, P+N), giving each row ``prefix_mass`` on CLS."""
    b, h, n, _ = patch_attn.shape
    full = torch.zeros(b, h, prefix + n, prefix + n, dtype=patch_attn.dtype)
    full[..., prefix:, prefix:] = patch_attn * (1 - prefix_mass)
    if prefix:
        full[..., prefix:, 0] = prefix_mass
        full[..., :prefix, 0] = 1.0
    return full


def test_self_only_attention_is_zero():
    attn = with_prefix(torch.eye(64).expand(2, 3, 64, 64), prefix=1)
    assert torch.all(mean_attention_distance(attn, GRID, num_prefix_tokens=1) == 0)
    assert torch.all(attention_entropy(attn, num_prefix_tokens=1) == 0)


@pytest.mark.parametrize("prefix", [0, 1, 5])
def test_uniform_attention_reference_values(prefix):
    attn = with_prefix(torch.full((1, 2, 64, 64), 1 / 64), prefix=prefix, prefix_mass=0.3)
    patches = mean_attention_distance(attn, GRID, num_prefix_tokens=prefix, unit="patch")
    normalized = mean_attention_distance(attn, GRID, num_prefix_tokens=prefix)
    pixels = mean_attention_distance(attn, GRID, num_prefix_tokens=prefix, unit="pixel", patch_size=4)
    torch.testing.assert_close(patches, torch.full((1, 2), UNIFORM_MAD_PATCHES), atol=1e-4, rtol=0)
    torch.testing.assert_close(normalized, torch.full((1, 2), 0.4178), atol=1e-4, rtol=0)
    torch.testing.assert_close(pixels, patches * 4)
    torch.testing.assert_close(attention_entropy(attn, num_prefix_tokens=prefix), torch.ones(1, 2))


def test_raw_patch_mass_without_renormalisation():
    attn = with_prefix(torch.full((1, 1, 64, 64), 1 / 64), prefix=1, prefix_mass=0.75)
    raw = mean_attention_distance(attn, GRID, num_prefix_tokens=1, unit="patch", renormalize=False)
    torch.testing.assert_close(raw, torch.full((1, 1), UNIFORM_MAD_PATCHES * 0.25), atol=1e-4, rtol=0)


def test_hand_computed_two_by_two_grid():
    # query 0 splits its mass between itself and its diagonal neighbour (distance sqrt 2);
    # the other three attend to their right/left neighbour (distance 1).
    attn = torch.zeros(1, 1, 4, 4)
    attn[0, 0, 0, 0] = attn[0, 0, 0, 3] = 0.5
    attn[0, 0, 1, 0] = attn[0, 0, 2, 3] = attn[0, 0, 3, 2] = 1.0
    expected = (0.5 * math.sqrt(2) + 1 + 1 + 1) / 4
    mad = mean_attention_distance(attn, (2, 2), num_prefix_tokens=0, unit="patch")
    assert mad.item() == pytest.approx(expected, abs=1e-6)
    ent = attention_entropy(attn, num_prefix_tokens=0)
    assert ent.item() == pytest.approx((math.log(2) / math.log(4)) / 4, abs=1e-6)


def test_rows_without_patch_mass_are_left_out_and_nan_when_none_is_left():
    patch = torch.full((2, 2, 64, 64), 1 / 64)
    attn = with_prefix(patch, prefix=1)
    # image 0, head 0: half the queries put everything on CLS; they must not pull the mean to 0
    attn[0, 0, 1:33, 1:] = 0.0
    attn[0, 0, 1:33, 0] = 1.0
    # image 1, head 1: every query on CLS -> NaN
    attn[1, 1, 1:, 1:] = 0.0
    attn[1, 1, 1:, 0] = 1.0
    mad = mean_attention_distance(attn, GRID, num_prefix_tokens=1, unit="patch")
    ent = attention_entropy(attn, num_prefix_tokens=1)
    assert mad[1, 1].isnan() and ent[1, 1].isnan()
    # image 0 head 0 keeps only rows 32..63, whose uniform MAD differs from the full mean
    dist = grid_distances(GRID)
    expected = dist[32:].mean(dim=1).mean()
    assert mad[0, 0].item() == pytest.approx(expected.item(), abs=1e-5)
    assert mad[0, 1].item() == pytest.approx(UNIFORM_MAD_PATCHES, abs=1e-4)


def test_explicit_distance_matrix_for_rectangular_geometry():
    # 16 queries, 4 keys (a 2x2 reduced grid), uniform attention
    q = torch.rand(16, 2) * 4
    k = torch.rand(4, 2) * 4
    dist = torch.cdist(q, k)
    attn = torch.full((1, 1, 16, 4), 0.25)
    mad = mean_attention_distance(attn, num_prefix_tokens=0, distances=dist, unit="patch")
    assert mad.item() == pytest.approx(dist.mean().item(), abs=1e-6)
    normalized = mean_attention_distance(attn, num_prefix_tokens=0, distances=dist)
    assert normalized.item() == pytest.approx(dist.mean().item() / dist.max().item(), abs=1e-6)


attn_strategy = hnp.arrays("float64", st.tuples(st.integers(1, 2), st.integers(1, 3), st.just(17), st.just(17)),
                           elements=st.floats(0, 1, allow_nan=False))


@settings(max_examples=40, deadline=None)
@given(raw=attn_strategy)
def test_bounds_for_any_attention(raw):
    attn = torch.from_numpy(raw)
    attn = attn / attn.sum(-1, keepdim=True).clamp(min=1e-12)
    mad = mean_attention_distance(attn, (4, 4), num_prefix_tokens=1)
    ent = attention_entropy(attn, num_prefix_tokens=1)
    ok = ~mad.isnan()
    assert torch.all((mad[ok] >= 0) & (mad[ok] <= 1 + 1e-9))
    assert torch.all((ent[ok] >= -1e-9) & (ent[ok] <= 1 + 1e-9))


def test_shape_errors_name_the_fix():
    attn = torch.full((1, 1, 65, 65), 1 / 65)
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        mean_attention_distance(attn, GRID, num_prefix_tokens=0)
    with pytest.raises(ValueError, match="exactly one of"):
        mean_attention_distance(attn, num_prefix_tokens=1)
    with pytest.raises(ValueError, match="patch_size"):
        mean_attention_distance(attn, GRID, num_prefix_tokens=1, unit="pixel")
    with pytest.raises(ValueError, match="unit"):
        mean_attention_distance(attn, GRID, num_prefix_tokens=1, unit="furlong")
    with pytest.raises(ValueError, match="batch, heads"):
        attention_entropy(attn[0], num_prefix_tokens=1)
    with pytest.raises(ValueError, match="distances have shape"):
        mean_attention_distance(attn, num_prefix_tokens=1, distances=torch.zeros(3, 3))
    with pytest.raises(TypeError):
        mean_attention_distance(attn, GRID)  # num_prefix_tokens is required
