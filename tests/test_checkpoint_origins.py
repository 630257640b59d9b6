"""Original DINO / DINOv2 checkpoints in timm architectures: origin from the keys, position tables interpolated as the
original repositories do, and the refusals. The files are built here in the original layouts (plain state dicts,
the repositories' key names) from tiny random timm models."""

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from vitscope.models import load
from vitscope.models.weights.origins import detect_origin

TINY = {"depth": 1, "embed_dim": 64, "num_heads": 2}


def original_interpolation(table, grid, offset, antialias):
    """DINO / DINOv2 interpolate_pos_encoding, from their documented behaviour: the CLS entry kept, the M x M patch
    table resized bicubically by scale_factor (g + offset) / M (offset 0: to size g), antialias as configured."""
    cls_entry, patches = table[:, :1], table[:, 1:]
    side = int(math.sqrt(patches.shape[1]))
    square = patches.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    if offset:
        out = F.interpolate(square, scale_factor=((grid + offset) / side, (grid + offset) / side), mode="bicubic",
                            antialias=antialias)
    else:
        out = F.interpolate(square, size=(grid, grid), mode="bicubic", antialias=antialias)
    return torch.cat([cls_entry, out.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)], dim=1)


def perturbed(state):
    torch.manual_seed(3)
    return {k: v + 0.1 * torch.randn_like(v) for k, v in state.items()}


def dino_file(tmp_path, patch=16, side=4):
    """An original DINO backbone file: timm's names, no head, the position table with its CLS entry (1 + M*M)."""
    model = load(f"timm:vit_small_patch{patch}_224", img_size=patch * side, num_classes=0, **TINY)
    state = perturbed(model.state_dict())
    torch.save(state, tmp_path / f"dino{patch}.pth")
    return tmp_path / f"dino{patch}.pth", state


def dinov2_file(tmp_path, registers=0, side=4):
    """An original DINOv2 file: mask_token, register_tokens, a position table with its CLS entry, LayerScale."""
    model = load("timm:vit_small_patch14_dinov2", img_size=14 * side, num_classes=0, **TINY)
    state = perturbed(model.state_dict())
    state["mask_token"] = torch.zeros(1, 64)
    if registers:
        state["register_tokens"] = torch.randn(1, registers, 64)
    path = tmp_path / f"dinov2_reg{registers}.pth"
    torch.save(state, path)
    return path, state


def test_origins_detected_from_keys(tmp_path):
    assert detect_origin(dino_file(tmp_path)[1]) == "dino"
    assert detect_origin(dinov2_file(tmp_path)[1]) == "dinov2"
    assert detect_origin({"storage_tokens": 0, "cls_token": 0}) == "dinov3"
    assert detect_origin({"embeddings.cls_token": 0}) == "hf"
    assert detect_origin({"cls_token": 0, "pos_embed": torch.zeros(1, 17, 4), "head.weight": 0}) == "timm"
    assert detect_origin({"cls_token": 0, "pos_embed": torch.zeros(1, 16, 4)}) == "timm"  # headless DeiT-III: no CLS


def test_dino_at_a_non_native_size_interpolates_as_dino_does(tmp_path, capsys):
    path, state = dino_file(tmp_path)
    model = load("timm:vit_small_patch16_224", weights=path, img_size=48, **TINY)  # 4 x 4 table to 3 x 3
    want = original_interpolation(state["pos_embed"], 3, offset=0.1, antialias=False)
    torch.testing.assert_close(model.pos_embed.data, want, atol=1e-6, rtol=0)
    timm_way = resample_abs_pos_embed(state["pos_embed"], [3, 3], [4, 4], num_prefix_tokens=1)
    assert (timm_way - want).abs().max() > 1e-3  # the two interpolations differ: the test can tell them apart
    line = capsys.readouterr().err
    assert "origin dino," in line and "classifier head" in line and "as the DINO repository does" in line
    assert model.num_classes == 0 and model.vitscope_load["pos_interp"] == "original"  # headless file, head dropped
    forced = load("timm:vit_small_patch16_224", weights=path, img_size=48, pos_interp="timm", **TINY)
    torch.testing.assert_close(forced.pos_embed.data, timm_way, atol=1e-6, rtol=0)
    assert forced.vitscope_load["pos_interp"] == "timm"
    native = load("timm:vit_small_patch16_224", weights=path, img_size=64, **TINY)
    assert torch.equal(native.pos_embed.data, state["pos_embed"]) and native.vitscope_load["pos_interp"] is None


@pytest.mark.parametrize("registers", [0, 4])
def test_dinov2_at_a_non_native_size_interpolates_as_dinov2_does(tmp_path, registers):
    path, state = dinov2_file(tmp_path, registers)
    spec = "timm:vit_small_patch14_reg4_dinov2" if registers else "timm:vit_small_patch14_dinov2"
    model = load(spec, weights=path, img_size=42, **TINY)  # 4 x 4 table to 3 x 3
    # without registers: interpolate_offset 0.1, no antialiasing; the register models: offset 0, antialiased
    want = original_interpolation(state["pos_embed"], 3, offset=0.0 if registers else 0.1, antialias=bool(registers))
    if registers:  # timm keeps the CLS entry in the CLS token (no_embed_class)
        torch.testing.assert_close(model.pos_embed.data, want[:, 1:], atol=1e-6, rtol=0)
        torch.testing.assert_close(model.cls_token.data, state["cls_token"] + want[:, :1], atol=1e-6, rtol=0)
        torch.testing.assert_close(model.reg_token.data, state["register_tokens"], atol=0, rtol=0)
    else:
        torch.testing.assert_close(model.pos_embed.data, want, atol=1e-6, rtol=0)
    assert model.vitscope_load["origin"] == "dinov2"


def test_a_patch_size_mismatch_is_refused(tmp_path):
    path, _ = dino_file(tmp_path, patch=8, side=8)
    with pytest.raises(ValueError, match=r"dino8.pth: patch_embed.proj.weight is a 8x8 patch kernel .* 16x16"):
        load("timm:vit_small_patch16_224", weights=path, img_size=64, num_classes=0, **TINY)  # timm resampled it


def test_missing_register_tokens_are_refused(tmp_path):
    path, _ = dinov2_file(tmp_path, registers=0)
    with pytest.raises(ValueError, match=r"dinov2_reg0.pth: no register tokens .* has 4"):
        load("timm:vit_small_patch14_reg4_dinov2", weights=path, img_size=56, **TINY)
    model = load("timm:vit_small_patch14_reg4_dinov2", img_size=56, num_classes=0, **TINY)  # timm's own names
    state = {k: v for k, v in model.state_dict().items() if k != "reg_token"}
    torch.save(state, tmp_path / "noreg.pth")
    with pytest.raises(ValueError, match="noreg.pth: no register tokens"):
        load("timm:vit_small_patch14_reg4_dinov2", weights=tmp_path / "noreg.pth", img_size=56, **TINY)
    deit = load("timm:deit3_small_patch16_224", img_size=64, **TINY)
    torch.save(deit.state_dict(), tmp_path / "deit3.pth")  # registers vitscope adds may be absent from the file
    added = load("timm:deit3_small_patch16_224", weights=tmp_path / "deit3.pth", img_size=64, num_registers=2, **TINY)
    assert added.reg_token.shape == (1, 2, 64) and added.vitscope_load["origin"] == "timm"


@pytest.mark.parametrize("change,match", [
    (lambda s: {**s, "blocks.0.attn.extra": torch.zeros(1)},
     r"unexpected \['blocks.0.attn.extra'\]; .*only a known head"),
    (lambda s: {k: v for k, v in s.items() if k != "blocks.0.norm1.weight"},
     r"missing \['blocks.0.norm1.weight'\]; .*only a known head"),
    (lambda s: {f"encoder.layer.{k}": v for k, v in s.items()}, r"Hugging Face .*hf:FOLDER"),
])
def test_unknown_keys_are_refused_naming_the_file_and_key(tmp_path, change, match):
    _, state = dino_file(tmp_path)
    torch.save(change(state), tmp_path / "changed.pth")
    with pytest.raises(ValueError, match="changed.pth.*" + match):
        load("timm:vit_small_patch16_224", weights=tmp_path / "changed.pth", img_size=64, **TINY)


def test_a_full_dino_training_checkpoint_drops_its_head(tmp_path, capsys):
    _, state = dino_file(tmp_path)
    teacher = {f"backbone.{k}": v for k, v in state.items()}
    teacher["head.mlp.0.weight"] = torch.zeros(8, 64)
    teacher["head.last_layer.weight_g"] = torch.zeros(8, 1)
    torch.save({"teacher": teacher}, tmp_path / "checkpoint.pth")
    model = load("timm:vit_small_patch16_224", weights=tmp_path / "checkpoint.pth", img_size=64, num_classes=0, **TINY)
    assert torch.equal(model.pos_embed.data, state["pos_embed"])
    assert "dropped the file's head" in capsys.readouterr().err
    with pytest.raises(ValueError, match="pos_interp='bilinear' is unknown"):
        load("timm:vit_small_patch16_224", pos_interp="bilinear")


@pytest.mark.parametrize("choice", ["timm"])
def test_cli_records_the_interpolation_used_in_the_provenance(tmp_path, choice, capsys):
    import json

    from vitscope.cli import main

    model = load("timm:vit_tiny_patch16_224", img_size=64, num_classes=0)
    torch.save(model.state_dict(), tmp_path / "dino_tiny.pth")  # the DINO layout: timm names, no head
    extra = ["--pos-interp", choice] if choice else []
    code = main(["analyze", "locality", "--model", "timm:vit_tiny_patch16_224", "--weights",
                 str(tmp_path / "dino_tiny.pth"), "--img-size", "48", "--dataset", "synthetic", "--num-images", "2",
                 "--batch-size", "2", "--device", "cpu", "--out", str(tmp_path / "out"), *extra])
    assert code == 0
    payload = json.loads((tmp_path / "out" / "locality.json").read_text())
    loaded = payload["provenance"]["config"]["model_load"]
    assert loaded["origin"] == "dino" and loaded["pos_interp"] == (choice or "original")
    assert "origin dino," in capsys.readouterr().err


def test_probe_cli_records_the_interpolation_used_in_the_provenance(tmp_path):
    import json

    from vitscope.cli import main

    model = load("timm:vit_tiny_patch16_224", img_size=64, num_classes=0)
    torch.save(model.state_dict(), tmp_path / "dino_tiny.pth")
    code = main(["probe", "pca", "--model", "timm:vit_tiny_patch16_224", "--weights", str(tmp_path / "dino_tiny.pth"),
                 "--img-size", "48", "--pos-interp", "timm", "--dataset", "synthetic", "--num-images", "2",
                 "--count", "2", "--batch-size", "2", "--device", "cpu", "--out", str(tmp_path / "out")])
    assert code == 0
    loaded = json.loads((tmp_path / "out" / "pca.json").read_text())["provenance"]["config"]["model_load"]
    assert loaded["origin"] == "dino" and loaded["pos_interp"] == "timm"


def test_an_original_dinov3_file_loads_into_timms_dinov3(tmp_path, capsys):
    """The DINOv3 repository's names (storage_tokens, ls1.gamma, rope_embed.periods, qkv.bias with its mask)."""
    model = load("timm:vit_small_patch16_dinov3", img_size=64, num_classes=0, **TINY).eval()
    state = perturbed(model.state_dict())
    model.load_state_dict(state)
    names = {"reg_token": "storage_tokens", "gamma_1": "ls1.gamma", "gamma_2": "ls2.gamma"}
    original = {}
    for key, value in state.items():
        for timm_name, name in names.items():
            key = key.replace(timm_name, name)
        original[key] = value
    original |= {"mask_token": torch.zeros(1, 64), "rope_embed.periods": torch.ones(8),
                 "blocks.0.attn.qkv.bias": torch.zeros(192), "blocks.0.attn.qkv.bias_mask": torch.ones(192)}
    torch.save(original, tmp_path / "dinov3.pth")
    loaded = load("timm:vit_small_patch16_dinov3", weights=tmp_path / "dinov3.pth", img_size=64, **TINY).eval()
    images = torch.randn(2, 3, 48, 80)  # RoPE: any size, nothing to interpolate
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images), atol=0, rtol=0)
    assert loaded.vitscope_load["origin"] == "dinov3" and "origin dinov3" in capsys.readouterr().err
    del original["storage_tokens"]
    torch.save(original, tmp_path / "dinov3_noreg.pth")
    with pytest.raises(ValueError, match="dinov3_noreg.pth: no register tokens"):
        load("timm:vit_small_patch16_dinov3", weights=tmp_path / "dinov3_noreg.pth", img_size=64, **TINY)


def test_a_dinov2_backbone_in_timms_names_is_said_to_be_dinov2(tmp_path, capsys):
    """A DINOv2 file in timm's key names (as timm's vit_small_patch14_dinov2 files: no mask_token, LayerScale,
    14-pixel patches) has origin dinov2, not dino, and the load line names whose code interpolated its positions."""
    model = load("timm:vit_small_patch14_dinov2", img_size=56, num_classes=0, **TINY)
    state = perturbed(model.state_dict())
    assert "mask_token" not in state and "blocks.0.ls1.gamma" in state
    torch.save(state, tmp_path / "dinov2_timm_names.pth")
    assert detect_origin(state) == "dinov2" and detect_origin(dino_file(tmp_path)[1]) == "dino"
    loaded = load("timm:vit_small_patch14_dinov2", weights=tmp_path / "dinov2_timm_names.pth", img_size=42, **TINY)
    want = original_interpolation(state["pos_embed"], 3, offset=0.1, antialias=False)  # DINOv2 without registers
    torch.testing.assert_close(loaded.pos_embed.data, want, atol=1e-6, rtol=0)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "origin dinov2," in line and "positions interpolated as the DINOv2 repository does" in line
    load("timm:vit_small_patch14_dinov2", weights=tmp_path / "dinov2_timm_names.pth", img_size=42, pos_interp="timm",
         **TINY)
    assert "positions interpolated as timm does" in capsys.readouterr().err
