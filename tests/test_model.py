"""The VisionTransformer: contract, presets, fused vs manual attention, timm as a reference."""

import pytest
import timm
import torch

from vitscope.attention import use_fused_attention
from vitscope.models import PRESETS, VisionTransformer, ViTConfig, count_parameters, create, load, save_model


@pytest.fixture
def images():
    torch.manual_seed(0)
    return torch.randn(2, 3, 32, 32)


def test_compact_preset_size():
    model = create("vit-compact")
    assert 2_300_000 <= count_parameters(model) <= 2_500_000
    assert model.grid_size == (8, 8) and model.patch_size == 4 and model.num_prefix_tokens == 1
    assert (len(model.blocks), model.embed_dim, model.blocks[0].attn.num_heads) == (8, 192, 8)


def test_forward_features_contract_with_registers(images):
    model = create("vit-micro", num_registers=4).eval()
    feats = model.forward_features(images)
    assert feats["cls"].shape == (2, 64)
    assert feats["registers"].shape == (2, 4, 64)
    assert feats["patches"].shape == (2, 64, 64)
    assert feats["prenorm"].shape == (2, 1 + 4 + 64, 64)
    assert model.num_prefix_tokens == 5
    torch.testing.assert_close(feats["patches"], model.norm(feats["prenorm"][:, 5:]))
    assert model(images).shape == (2, 10)


def test_registers_carry_no_positional_embedding(images):
    model = create("vit-micro", num_registers=2).eval()
    with torch.no_grad():
        tokens = model.embed(images)
    # registers are the bare learned tokens; CLS got its positional embedding
    torch.testing.assert_close(tokens[:, 1:3], model.reg_token.expand(2, -1, -1))
    torch.testing.assert_close(tokens[:, 0], (model.cls_token + model.pos_embed[:, :1])[:, 0].expand(2, -1))
    assert model.pos_embed.shape[1] == 1 + 64


def test_gap_pool_without_class_token_and_headless(images):
    model = create("vit-micro", class_token=False, pool="gap", num_classes=0).eval()
    feats = model.forward_features(images)
    assert feats["cls"] is None and model.num_prefix_tokens == 0
    torch.testing.assert_close(model(images), feats["patches"].mean(1))


@pytest.mark.parametrize("pos", ["learn", "sincos"])
def test_fused_and_manual_paths_agree(images, pos):
    model = create("vit-micro", pos_embed=pos).eval()
    with torch.no_grad():
        fused = model(images)
        use_fused_attention(model, False)
        manual = model(images)
    torch.testing.assert_close(fused, manual, atol=1e-5, rtol=0)
    # and the gradients agree too
    use_fused_attention(model, True)
    x = images.clone().requires_grad_()
    model(x).sum().backward()
    grad_fused = x.grad.clone()
    x.grad = None
    use_fused_attention(model, False)
    model(x).sum().backward()
    torch.testing.assert_close(grad_fused, x.grad, atol=1e-5, rtol=0)


def test_same_output_as_timm_vision_transformer_with_our_weights(images):
    ours = create("vit-micro").eval()
    cfg = ours.cfg
    reference = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=cfg.num_classes, embed_dim=cfg.embed_dim,
        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, global_pool="token").eval()
    reference.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), atol=1e-5, rtol=0)
        ours_blocks = ours.forward_intermediates(images, indices=[0, -1])
        ref_blocks = reference.forward_intermediates(images, indices=[0, 3], output_fmt="NLC",
                                                     return_prefix_tokens=True, intermediates_only=True)
    for mine, (patches, prefix) in zip(ours_blocks, ref_blocks, strict=True):
        torch.testing.assert_close(mine, torch.cat([prefix, patches], 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["sparsemax", "entmax15", "entmax:1.3"])
def test_sparse_normalisers_train(images, attention):
    model = create("vit-micro", attention=attention)
    loss = model(images).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_forward_intermediates_indices(images):
    model = create("vit-micro").eval()
    assert len(model.forward_intermediates(images)) == 4
    assert len(model.forward_intermediates(images, indices=2)) == 2
    with pytest.raises(ValueError, match="out of range"):
        model.forward_intermediates(images, indices=[7])


@pytest.mark.parametrize("overrides,fragment", [
    ({"img_size": 30}, "not divisible by patch size"),
    ({"attention": "gumbel"}, "unknown attention normaliser"),
    ({"attention": "entmax:2.5"}, r"outside \(1, 2\]"),
    ({"num_heads": 5}, "not divisible by num_heads"),
    ({"class_token": False}, "pool='cls' needs class_token"),
    ({"widht": 3}, "unknown model option"),
])
def test_bad_config_names_the_fix(overrides, fragment):
    with pytest.raises(ValueError, match=fragment):
        create("vit-micro", **overrides)


def test_unknown_preset_and_wrong_image_size(images):
    with pytest.raises(ValueError, match="vit-compact"):
        create("vit-huge")
    with pytest.raises(ValueError, match="multiple of 4 pixels"):
        create("vit-micro")(images[..., :18, :18])


@pytest.mark.parametrize("pos_embed", ["learn", "sincos"])
@pytest.mark.parametrize("size", [(16, 16), (48, 24)])
def test_any_input_size_matches_timm_dynamic_img_size(images, size, pos_embed):
    """The positional embedding is resampled as timm's dynamic_img_size does (bicubic, antialiased)."""
    ours = create("vit-micro", pos_embed=pos_embed).eval()
    with torch.no_grad():
        ours.pos_embed.normal_() if pos_embed == "learn" else None
    cfg = ours.cfg
    reference = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=cfg.num_classes, embed_dim=cfg.embed_dim,
        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, global_pool="token",
        dynamic_img_size=True).eval()
    state = ours.state_dict() | ({"pos_embed": ours.pos_embed} if pos_embed == "sincos" else {})
    reference.load_state_dict(state, strict=True)
    x = torch.nn.functional.interpolate(images, size=size, mode="bilinear")
    with torch.no_grad():
        if pos_embed == "learn":
            torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)
        else:  # recomputed on the new grid: equal to a model built for that size
            same = create("vit-micro", pos_embed="sincos", img_size=size[0]).eval() if size[0] == size[1] else None
            if same is not None:
                same.load_state_dict(ours.state_dict())
                torch.testing.assert_close(ours(x), same(x), atol=1e-6, rtol=0)
            assert not torch.allclose(ours(x), reference(x), atol=1e-3)  # not an interpolation of the table


def test_registers_take_no_positional_embedding_at_any_size(images):
    model = create("vit-micro", num_registers=2).eval()
    x = images[..., :16, :24]
    tokens = model.embed(x)
    assert tokens.shape == (len(x), 1 + 2 + 4 * 6, model.embed_dim)
    torch.testing.assert_close(tokens[:, 1:3], model.reg_token.expand(len(x), -1, -1))


def test_save_and_load_round_trip(tmp_path, images):
    model = create("vit-micro", num_registers=1, attention="entmax15").eval()
    path = save_model(model, tmp_path / "model.safetensors")
    again = load(str(path)).eval()
    assert isinstance(again, VisionTransformer) and again.cfg == model.cfg
    with torch.no_grad():
        torch.testing.assert_close(model(images), again(images))
    assert load(str(tmp_path)).cfg == model.cfg  # a run folder holding model.safetensors
    fresh = load("vit-micro", num_registers=1, attention="entmax15", weights=path)
    torch.testing.assert_close(fresh.state_dict()["pos_embed"], model.state_dict()["pos_embed"])


def test_presets_are_valid_configs():
    for cfg in PRESETS.values():
        assert isinstance(cfg, ViTConfig)
        assert cfg.img_size % cfg.patch_size == 0
