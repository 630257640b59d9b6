"""timm's 2025-26 families: DINOv3 and EVA-02 (EvaAttention), the RoPE ViTs (AttentionRope), NaFlexVit (SigLIP2).

Recorded maps are checked against timm's own manual path (``fused_attn=False``, probabilities read where the module
hands them to ``attn_drop``); geometry against brute-force distances; NaFlex padding against each image run alone."""

import numpy as np
import pytest
import torch
from timm.models.naflexvit import batch_patchify

import vitscope
from vitscope.metrics import attention_entropy, mean_attention_distance
from vitscope.models import load, token_layout
from vitscope.models.capture.token_map import token_map
from vitscope.record import record_tokens

TINY = {"depth": 2, "embed_dim": 64, "num_heads": 2}
FAMILIES = {  # spec, options, input (H, W)
    "dinov3": ("timm:vit_small_patch16_dinov3", {}, (48, 64)),  # dynamic size: a non-square input
    "eva02": ("timm:eva02_small_patch14_224", {"img_size": 56}, (56, 56)),
    "rope-axial": ("timm:vit_small_patch16_rope_224", {"img_size": 48}, (48, 48)),
    "rope-mixed": ("timm:vit_small_patch16_rope_mixed_224", {"img_size": 48}, (48, 48)),
    "naflex": ("timm:naflexvit_base_patch16_gap", {"img_size": 48}, (48, 48)),
}


def build(family, seed=0):
    spec, options, (h, w) = FAMILIES[family]
    torch.manual_seed(seed)
    model = load(spec, **TINY, **options).eval()
    return model, torch.randn(2, 3, h, w)


def attention_modules(model):
    return [block.attn for block in model.blocks]


def manual_maps(model, inputs):
    """Probabilities from timm's manual path: fused attention off, read at the input of each attn_drop."""
    maps, modules = [], attention_modules(model)
    hooks = [m.attn_drop.register_forward_hook(lambda _m, args, _out: maps.append(args[0])) for m in modules]
    for m in modules:
        m.fused_attn = False
    try:
        with torch.no_grad():
            out = model(inputs)
    finally:
        for m in modules:
            m.fused_attn = True
        for h in hooks:
            h.remove()
    return maps, out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_maps_equal_timms_manual_path_with_fused_attention_left_on(family):
    model, images = build(family)
    modules = attention_modules(model)
    assert all(m.fused_attn for m in modules)
    with torch.no_grad():
        expected = model(images)
        with vitscope.record_attention(model) as rec, vitscope.record_attention(model, keep="stats") as stats:
            out = model(images)
    assert torch.equal(out, expected)  # recording never changes the path or the output
    assert all(m.fused_attn and not m._forward_hooks and not m._forward_pre_hooks for m in modules)
    want, _ = manual_maps(model, images)
    assert len(rec.maps) == len(want) == 2
    for got, ref in zip(rec.maps, want, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    layout = rec.layouts[0]
    assert layout.grid_size == (images.shape[-2] // layout.patch_size, images.shape[-1] // layout.patch_size)
    for i, probs in enumerate(rec.maps):  # streamed statistics equal the metrics of the maps
        mad = mean_attention_distance(probs, num_prefix_tokens=layout.num_prefix_tokens, grid_size=layout.grid_size)
        ent = attention_entropy(probs, num_prefix_tokens=layout.num_prefix_tokens)
        torch.testing.assert_close(stats.stats.mad[i], mad.mean(0), atol=1e-5, rtol=0)
        torch.testing.assert_close(stats.stats.entropy[i], ent.mean(0), atol=1e-5, rtol=0)


def brute_force_uniform_mad(gh, gw):
    """Mean over patch queries of the mean distance to every patch, divided by the grid's largest distance."""
    coords = np.array([(r, c) for r in range(gh) for c in range(gw)], dtype=float)
    dist = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    return dist.mean() / dist.max()


@pytest.mark.parametrize("family", ["dinov3", "rope-axial"])
def test_mad_geometry_of_rope_models_known_answer(family):
    """q = k = 0 gives uniform attention whatever the rotation: MAD is the grid's mean distance, entropy 1."""
    model, _ = build(family)
    with torch.no_grad():
        for attn in attention_modules(model):
            weight = attn.qkv.weight if attn.qkv is not None else None
            weight[: 2 * weight.shape[0] // 3] = 0  # q and k rows of the fused projection
            for name in ("q_bias", "k_bias"):
                if getattr(attn, name, None) is not None:
                    getattr(attn, name).zero_()
            if attn.qkv.bias is not None:
                attn.qkv.bias[: 2 * weight.shape[0] // 3] = 0
    h, w = (80, 48) if family == "dinov3" else (48, 48)  # DINOv3 at a 5 x 3 grid, the RoPE ViT at its own 3 x 3
    with torch.no_grad(), vitscope.record_attention(model, keep="stats") as rec:
        model(torch.randn(2, 3, h, w))
    grid = (h // 16, w // 16)
    assert rec.layouts[0].grid_size == grid
    torch.testing.assert_close(rec.stats.mad, torch.full_like(rec.stats.mad, brute_force_uniform_mad(*grid)),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(rec.stats.entropy, torch.ones_like(rec.stats.entropy), atol=1e-5, rtol=0)


def test_registers_are_prefix_tokens():
    dinov3, _ = build("dinov3")
    layout = token_layout(dinov3)
    assert (layout.num_prefix_tokens, layout.num_registers, layout.has_cls) == (5, 4, True)
    tokens = token_map(dinov3)
    assert tokens["cls"] == [0] and tokens["registers"] == [1, 2, 3, 4] and tokens["patches"]["start"] == 5
    naflex, _ = build("naflex")  # the 'gap' NaFlexVit: four registers and no CLS
    tokens = token_map(naflex)
    assert tokens["cls"] == [] and tokens["registers"] == [0, 1, 2, 3] and tokens["patches"]["grid"] == [3, 3]


def naflex_batch(images, patch=16):
    """NaFlex's dict input: each image patchified on its own grid, padded to the longest, with coordinates."""
    pieces = [batch_patchify(image[None], (patch, patch)) for image in images]
    length = max(p.shape[1] for p, _ in pieces)
    patches = torch.zeros(len(images), length, pieces[0][0].shape[-1])
    coords = torch.zeros(len(images), length, 2, dtype=torch.long)
    valid = torch.zeros(len(images), length, dtype=torch.bool)
    for i, (p, (gh, gw)) in enumerate(pieces):
        n = gh * gw
        patches[i, :n], valid[i, :n] = p[0], True
        coords[i, :n] = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij"), -1).view(-1, 2)
    return {"patches": patches, "patch_coord": coords, "patch_valid": valid}


def test_naflex_two_aspect_ratios_in_one_batch_padding_enters_no_metric():
    model, _ = build("naflex")
    torch.manual_seed(1)
    images = [torch.randn(3, 32, 64), torch.randn(3, 64, 32), torch.randn(3, 32, 64)]  # 2 x 4, 4 x 2, 2 x 4
    batch = naflex_batch(images)
    assert batch["patch_valid"].all()  # equal lengths: pad one more token to have padding for sure
    batch = {k: torch.cat([v, v[:, :1] * 0], dim=1) for k, v in batch.items()}
    with torch.no_grad():
        expected = model(batch)
        with vitscope.record_attention(model) as rec, vitscope.record_attention(model, keep="stats") as stats:
            out = model(batch)
    assert torch.equal(out, expected)
    want, _ = manual_maps(model, batch)
    for got, ref in zip(rec.maps, want, strict=True):  # padded maps as timm's manual path gives them
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    alone_mad, alone_ent = [], []  # each image run alone, unpadded, as a plain image batch
    for image in images:
        with torch.no_grad(), vitscope.record_attention(model) as single:
            model(image[None])
        layout = single.layouts[0]
        alone_mad.append(torch.stack([mean_attention_distance(p, num_prefix_tokens=4, grid_size=layout.grid_size)[0]
                                      for p in single.maps]))
        alone_ent.append(torch.stack([attention_entropy(p, num_prefix_tokens=4)[0] for p in single.maps]))
    assert stats.stats.images.tolist() == [3, 3]  # one count per image, padding or not
    torch.testing.assert_close(stats.stats.mad, torch.stack(alone_mad).mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(stats.stats.entropy, torch.stack(alone_ent).mean(0), atol=1e-5, rtol=0)


def test_record_tokens_and_swap_refusal_on_rope_models():
    model, images = build("dinov3")
    with torch.no_grad(), record_tokens(model, keep="norms") as rec:
        model(images)
    assert [n.shape for n in rec.norms] == [(2, 5 + 12)] * 2
    with pytest.raises(ValueError, match="EvaAttention.*rotary"):
        load("timm:vit_small_patch16_dinov3", attention="entmax15", **TINY)


def test_siglip_blocks_take_the_normaliser_and_its_pooling_head_keeps_softmax():
    from timm.layers import AttentionPoolLatent

    from vitscope.attention import Attention

    model = load("timm:vit_base_patch16_siglip_224", attention="entmax15", img_size=32, **TINY)
    assert all(isinstance(block.attn, Attention) for block in model.blocks)
    assert isinstance(model.attn_pool, AttentionPoolLatent)


def test_maps_of_batches_with_different_token_counts_are_refused_clearly():
    model, _ = build("dinov3")
    with torch.no_grad(), vitscope.record_attention(model) as rec:
        model(torch.randn(1, 3, 32, 32))
        model(torch.randn(1, 3, 48, 48))
    with pytest.raises(ValueError, match=r"different token counts \[9, 14\].*keep='stats'"):
        _ = rec.maps


@pytest.mark.parametrize("family", ["dinov3", "naflex"])
def test_probe_features_read_the_new_families(family):
    from vitscope.data import synthetic_scenes
    from vitscope.probes.features import extract_features

    model, _ = build(family)
    data = synthetic_scenes("eval", num_images=4)
    features = extract_features(model, data, layers="0,last", cache=False, progress=False, batch_size=4)
    layout = token_layout(model)
    for layer in (0, 2):
        got = features[layer]
        assert got.tokens.shape == (4, layout.num_prefix_tokens + layout.num_patches, 64)
        assert (got.num_prefix_tokens, got.num_registers) == (layout.num_prefix_tokens, layout.num_registers)
    with torch.no_grad(), record_tokens(model, layers=[1]) as rec:  # the last layer, after the final norm
        from vitscope.analyze.inputs import model_batches

        for images, _ in model_batches(model, data, 4, "cpu"):
            model(images)
    torch.testing.assert_close(features[2].tokens.float(), rec.normed[0], atol=2e-3, rtol=2e-3)  # stored as fp16
