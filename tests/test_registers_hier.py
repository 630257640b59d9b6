"""Hierarchical models in the registers study: the keys each Swin / PVT-v2 query sees, checked against timm's own
window partition, pooling and attention output; planted outliers found in the stage where they were planted;
attention mass equal to the visible share under uniform attention."""

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import window_partition

from vitscope.data import synthetic_scenes
from vitscope.metrics.visible_keys import reduced_high_keys, swin_window_keys, window_mass_on_high_norm
from vitscope.models import load
from vitscope.models.capture.sites import token_blocks
from vitscope.probes.stage_features import stage_last_layers
from vitscope.probes.tokens import probe_tokens
from vitscope.record import record_attention
from vitscope.studies.registers.census import CensusSettings, run_census
from vitscope.studies.registers.probes import ProbeSettings, probe_model

SWIN = {"img_size": 24, "patch_size": 4, "window_size": 4, "depths": (2, 2), "embed_dim": 16, "num_heads": (2, 2)}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_swin():
    """Built with timm directly: vitscope's img_size= rescales the 7-token window with the grid (to 1 here)."""
    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224", num_classes=0, **SWIN).eval()


def tiny_pvt():
    torch.manual_seed(0)
    return load("timm:pvt_v2_b0").eval()


@pytest.mark.parametrize(("resolution", "window", "shift"), [((6, 6), (4, 4), (2, 2)), ((8, 8), (4, 4), (0, 0)),
                                                             ((5, 7), (4, 4), (1, 2))])
def test_window_keys_follow_timms_roll_pad_and_partition(resolution, window, shift):
    h, w = resolution
    index = torch.arange(h * w, dtype=torch.float32).view(1, h, w, 1)
    rolled = torch.roll(index, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    pad_h, pad_w = (-h) % window[0], (-w) % window[1]
    padded = F.pad(rolled, (0, 0, 0, pad_w, 0, pad_h), value=-1.0)
    expected = window_partition(padded, window).reshape(-1, window[0] * window[1]).long()  # timm's own code
    keys = swin_window_keys(resolution, window, shift)
    rows = expected.repeat_interleave(window[0] * window[1], dim=0)  # every query of a window sees that window
    queries = expected.reshape(-1)
    kept = queries >= 0
    assert torch.equal(keys.query, queries[kept])
    assert torch.equal(keys.keys, rows[kept])
    assert torch.equal(keys.visible, rows[kept] >= 0)
    assert sorted(keys.query.tolist()) == list(range(h * w))  # every token is a query exactly once


@torch.no_grad()
def test_swin_maps_scattered_through_the_key_indices_reproduce_timms_attention_output():
    model = tiny_swin()
    blocks = [block for _, block in token_blocks(model)]
    block = blocks[1]  # shifted windows (shift 2) on a 6x6 grid padded to 8x8
    assert tuple(block.shift_size) == (2, 2) and tuple(block.input_resolution) == (6, 6)
    attn = block.attn
    dim = attn.qkv.in_features
    attn.qkv.bias[2 * dim:] = 0  # padded tokens then carry v = 0, as the canonical maps drop them
    x = block.norm1(torch.randn(2, 6, 6, dim))
    with record_attention(model, layers=[1], keep="maps") as rec:
        reference = block._attn(x).reshape(2, 36, dim)
    probs = rec.maps[0]
    keys = swin_window_keys((6, 6), tuple(block.window_size), tuple(block.shift_size), block.attn_mask)
    heads = probs.shape[1]
    full = torch.zeros(2, heads, 36, 36)
    real = keys.keys >= 0
    rows = keys.query[:, None].expand_as(keys.keys)[real]
    full[:, :, rows, keys.keys[real]] = probs[:, :, real]
    v = attn.qkv(x.reshape(2, 36, dim))[..., 2 * dim:].view(2, 36, heads, -1).transpose(1, 2)
    mine = attn.proj((full @ v).transpose(1, 2).reshape(2, 36, dim))
    assert torch.allclose(mine, reference, atol=1e-5)
    # and the visible mass of a known key set matches a brute-force sum over the scattered matrix
    high = torch.zeros(2, 36, dtype=torch.bool)
    high[:, [0, 7, 35]] = True
    mass = window_mass_on_high_norm(probs, keys, high)
    visible = torch.zeros(36, 36, dtype=torch.bool)
    visible[rows, keys.keys[real]] = keys.visible[real]
    brute = (full * (visible & high[:, None, None, :].expand(-1, 1, 36, -1))).sum(-1).mean(dim=(1, 2))
    assert torch.allclose(mass["patch"], brute, atol=1e-6)


def test_reduced_keys_hold_a_high_norm_token_of_their_cell():
    torch.manual_seed(0)
    high = torch.rand(3, 8 * 8) > 0.9
    got = reduced_high_keys(high, (8, 8), 4)
    cells = high.view(3, 2, 4, 2, 4).any(dim=4).any(dim=2).reshape(3, 4)  # brute force: 4x4 cells
    assert torch.equal(got, cells)
    # the linear variant's adaptive 7x7 pool: a key holds a token when the pool of its one-hot map reaches it
    pooled = reduced_high_keys(high, (8, 8), (7, 7), pooled=True)
    onehots = torch.eye(64).view(64, 1, 8, 8)
    members = F.adaptive_avg_pool2d(onehots, 7).flatten(1) > 0  # (tokens, keys)
    assert torch.equal(pooled, (high.float() @ members.float()) > 0)
    assert torch.equal(reduced_high_keys(high, (8, 8), None), high)


def _planting_hook(positions, scale=40.0):
    def hook(_module, _inputs, output):
        out = output.clone()
        flat = out.view(out.shape[0], -1, out.shape[-1])
        flat[:, positions] *= scale
        return out
    return hook


@pytest.mark.parametrize("family", ["swin", "pvt"])
def test_planted_outliers_in_a_stage_are_found_at_that_stage_and_uniform_mass_equals_share(family):
    model = tiny_swin() if family == "swin" else tiny_pvt()
    size = 24 if family == "swin" else 64
    blocks = token_blocks(model)
    # block index (0-based) and stage where 2 planted tokens per image are at most 10 % (the auto split's cap): the
    # first block of Swin's 6x6 stage 1, of PVT-v2's 8x8 stage 2 (both models have 2 blocks a stage)
    planted, stage = (0, 1) if family == "swin" else (2, 2)
    stage_names = [name.split(".")[1] for name, _ in blocks]
    assert stage_names[planted] == stage_names[planted + 1] == str(stage - 1)
    with torch.no_grad():  # make attention uniform over what each query sees: mass must equal the share
        for _, block in blocks:
            if family == "swin":
                block.attn.qkv.weight[: 2 * block.attn.qkv.in_features] = 0
                block.attn.qkv.bias[: 2 * block.attn.qkv.in_features] = 0
                block.attn.relative_position_bias_table.zero_()
            else:
                block.attn.q.weight.zero_()
                block.attn.q.bias.zero_()
    positions = [0, 5]
    handle = blocks[planted][1].register_forward_hook(_planting_hook(positions))
    data = synthetic_scenes("eval", num_images=6)
    try:
        census = run_census(model, data, family, CensusSettings(thresholds=["auto"], img_size=size,
                                                                attention_images=4), progress=False)
    finally:
        handle.remove()
    tokens = census.high_norm[planted + 1].shape[1]
    in_stage = [r for r in census.rows if r["metric"] == "high_norm_fraction" and r["stage"] == stage]
    fractions = {r["layer"]: r["value"] for r in in_stage}
    assert fractions[planted + 1] == pytest.approx(len(positions) / tokens)  # found at the planted block ...
    assert all(value == pytest.approx(len(positions) / tokens) for value in fractions.values())
    expected = torch.zeros(6, tokens, dtype=torch.bool)
    expected[:, positions] = True
    assert torch.equal(census.high_norm[planted + 1], expected)  # ... exactly the planted tokens
    attention = {(r["layer"], r["group"]): r for r in census.rows if r["layer_kind"] == "attention"}
    reader = attention[(planted + 2, "patch-query")]  # attention layer planted+2 reads block planted+1's output
    share = attention[(planted + 2, "high-norm")]
    assert reader["stage"] == stage and share["value"] > 0
    assert reader["value"] == pytest.approx(share["value"], rel=1e-4)  # uniform attention: mass = share
    for key in attention.values():
        assert key["keys"] == ("window" if family == "swin" else "reduced grid")


def test_stage_probes_read_position_on_the_stage_grid_and_groups_per_stage():
    model = tiny_pvt()
    blocks = token_blocks(model)
    torch.manual_seed(1)
    code = torch.randn(64, blocks[3][1].norm1.normalized_shape[0]) * 10  # stage 2: 8x8 grid at 64 px

    def positions_and_outliers(_module, _inputs, output):  # tokens that carry their position; 1 in 16 outliers
        out = 0.1 * output + code
        out[:, ::16] *= 30.0
        return out

    handle = blocks[3][1].register_forward_hook(positions_and_outliers)  # the last block of stage 2 (layer 4)
    data = synthetic_scenes("eval", num_images=24)
    fit = {"lrs": (0.1,), "weight_decays": (0.0,), "epochs": 30}
    try:
        known = probe_tokens(model, data, [4], probes=["position", "pixels"], max_tokens=1024, baseline=False,
                             img_size=64, cache=False, progress=False, fit_options=fit).rows
        census = run_census(model, data, "pvt", CensusSettings(thresholds=["auto"], img_size=64, attention_images=4),
                            progress=False)
        settings = ProbeSettings(probes=["class"], max_tokens=64, min_group=4, fit_options=fit | {"epochs": 10})
        rows = probe_model(model, data, "pvt", census.high_norm, settings, img_size=64, baseline=False)
    finally:
        handle.remove()
    value = {(r["model"], r["group"], r["metric"]): r for r in known}
    assert value[("model", "patch", "position_top1")]["value"] > 0.95  # the planted code, read on the 8x8 grid
    assert value[("chance", "patch", "position_top1")]["value"] < 3 / 64  # the most frequent of 64 cells
    assert value[("model", "patch", "pixels_mse")]["stage"] == 2  # pixel targets over the stage's 8 px stride
    assert census.high_norm[4][:, ::16].all() and census.high_norm[4].sum() == 24 * 4
    assert [r["value"] for r in census.rows if r["metric"] == "separate_mode" and r["layer"] == 4] == [1.0]
    assert sorted({r["layer"] for r in rows}) == stage_last_layers(model) == [2, 4, 6, 8]
    assert all(r["stage"] == {2: 1, 4: 2, 6: 3, 8: 4}[r["layer"]] for r in rows)
    groups = {r["group"] for r in rows if r["layer"] == 4 and r["model"] == "pvt"}
    assert groups == {"patch", "high-norm", "normal", "patch-mean"}  # no CLS in these models


def test_hierarchical_token_layer_zero_is_refused_with_the_fix():
    data = synthetic_scenes("eval", num_images=4)
    with pytest.raises(ValueError, match="no layer 0.*--layers 1,last"):
        probe_tokens(tiny_pvt(), data, "0,last", baseline=False, img_size=64, cache=False, progress=False)
