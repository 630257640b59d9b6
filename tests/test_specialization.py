"""CLS/patch Specialization (vitscope.models.own.specialization) against known answers: each layer equals the shared
layer on the patch tokens and a second, separately parameterised one on the CLS token; a specialized model starts
as its plain twin; the parameter count is the published method's 8 % on a ViT-S/16; it saves, loads and trains."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitscope.models import create
from vitscope.models.own.config import ViTConfig
from vitscope.models.own.packed import check_packable
from vitscope.models.own.specialization import (
    SpecializedLayerNorm,
    SpecializedLinear,
    specialized_qkv_blocks,
)
from vitscope.models.own.vit import VisionTransformer


def test_the_layer_norm_takes_the_cls_pair_on_token_0_only():
    torch.manual_seed(0)
    norm = SpecializedLayerNorm(8)
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    x = torch.randn(3, 5, 8)
    out = norm(x)
    torch.testing.assert_close(out[:, :1], F.layer_norm(x[:, :1], (8,), norm.cls_weight, norm.cls_bias, 1e-6))
    torch.testing.assert_close(out[:, 1:], F.layer_norm(x[:, 1:], (8,), norm.weight, norm.bias, 1e-6))
    assert not torch.allclose(out[:, :1], F.layer_norm(x[:, :1], (8,), norm.weight, norm.bias, 1e-6))


def test_the_linear_map_takes_the_cls_weights_on_token_0_only():
    torch.manual_seed(0)
    shared = torch.nn.Linear(6, 12)
    linear = SpecializedLinear.like(shared)
    torch.testing.assert_close(linear.cls_weight, shared.weight)  # starts as the shared map
    with torch.no_grad():
        linear.cls_weight.normal_()
        linear.cls_bias.normal_()
    x = torch.randn(2, 4, 6)
    out = linear(x)
    torch.testing.assert_close(out[:, 1:], shared(x[:, 1:]))
    torch.testing.assert_close(out[:, :1], x[:, :1] @ linear.cls_weight.T + linear.cls_bias)
    out.sum().backward()  # both paths train
    assert linear.cls_weight.grad is not None and linear.weight.grad is not None


def test_a_specialized_model_starts_as_its_plain_twin_and_parts_by_training():
    torch.manual_seed(0)
    plain = create("vit-micro").eval()
    torch.manual_seed(0)
    special = create("vit-micro", cls_specialization=True).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(special(x), plain(x), atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        special.norm.cls_bias.add_(1.0)
    features, reference = special.forward_features(x), plain.forward_features(x)
    torch.testing.assert_close(features["cls"], reference["cls"] + 1.0)  # the final norm's CLS pair, CLS alone
    torch.testing.assert_close(features["patches"], reference["patches"])
    with torch.no_grad():
        special.blocks[0].attn.qkv.cls_weight.mul_(50.0)
    # the CLS query, key and value change in block 1, and every patch sees the changed CLS key and value
    changed = (special.forward_features(x)["patches"] - reference["patches"]).abs().amax(dim=-1)
    assert (changed > 1e-4).all()


def test_which_layers_are_specialized_and_the_parameter_cost():
    assert [specialized_qkv_blocks(d) for d in (1, 4, 8, 12, 24)] == [1, 1, 3, 4, 8]
    small = ViTConfig(img_size=224, patch_size=16, depth=12, embed_dim=384, num_heads=6, mlp_ratio=4.0,
                      num_classes=0)
    plain, special = VisionTransformer(small), VisionTransformer(small.replace(cls_specialization=True))
    count = {name: sum(p.numel() for p in m.parameters()) for name, m in (("plain", plain), ("special", special))}
    # 4 qkv projections (384 x 1152 + 1152) and 25 LayerNorms (2 x 384 each) more: +8.3 %, the paper's "8 %"
    assert count["special"] - count["plain"] == 4 * (384 * 1152 + 1152) + 25 * 2 * 384
    assert 0.075 < count["special"] / count["plain"] - 1 < 0.09
    kinds = [type(b.attn.qkv).__name__ for b in special.blocks]
    assert kinds == ["SpecializedLinear"] * 4 + ["Linear"] * 8
    assert isinstance(special.norm, SpecializedLayerNorm) and isinstance(special.blocks[11].norm2,
                                                                         SpecializedLayerNorm)


def test_it_needs_a_cls_token_and_does_not_pack():
    with pytest.raises(ValueError, match="needs class_token=True"):
        ViTConfig(class_token=False, pool="gap", cls_specialization=True)
    with pytest.raises(ValueError, match="unpacked"):
        check_packable([create("vit-micro", cls_specialization=True)])


def test_it_saves_and_loads_through_a_run_folder(tmp_path):
    from vitscope.models import load
    from vitscope.models.weights.checkpoint import save_model

    torch.manual_seed(1)
    model = create("vit-micro", cls_specialization=True, num_registers=2).eval()
    with torch.no_grad():
        model.norm.cls_bias.add_(0.5)
    save_model(model, tmp_path / "model.safetensors")
    back = load(str(tmp_path)).eval()
    assert back.cfg.cls_specialization and back.cfg.num_registers == 2
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(back.forward_features(x)["cls"], model.forward_features(x)["cls"])


def test_export_refuses_a_specialized_model_in_one_line(tmp_path):
    """timm's and transformers' ViTs have no CLS-only norms or projections: a strict reload would fail on the extra
    keys, so both exports refuse before writing anything."""
    from vitscope.models import create
    from vitscope.models.export.hf import export_hf
    from vitscope.models.export.timm import export_timm

    model = create("vit-micro", cls_specialization=True)
    with pytest.raises(ValueError, match="cls_specialization"):
        export_timm(model, tmp_path / "m.safetensors")
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="cls_specialization"):
        export_hf(model, tmp_path / "hf")
    assert not any(tmp_path.iterdir())
