"""vitscope export --format timm: timm's VisionTransformer built from the written arguments gives our logits."""

import json

import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vitscope.cli import main
from vitscope.models import create, load, save_model


@pytest.mark.parametrize("options", [{}, {"num_registers": 2}, {"pos_embed": "sincos", "pool": "gap"}])
def test_timm_logits_equal_ours_after_export(tmp_path, capsys, options):
    model = create("vit-micro", depth=2, **options).eval()
    with torch.no_grad():
        for param in (model.cls_token, model.reg_token):
            if param is not None:
                param.normal_()  # make the folded CLS position and registers matter
    save_model(model, tmp_path / "run" / "model.safetensors")
    out = tmp_path / "timm.safetensors"
    assert main(["export", "--model", str(tmp_path / "run"), "--format", "timm", "--out", str(out)]) == 0
    assert "note:" not in capsys.readouterr().out
    with safe_open(str(out), framework="pt") as handle:
        args = json.loads(handle.metadata()["timm_model_args"])
    reference = timm.models.vision_transformer.VisionTransformer(**args).eval()
    reference.load_state_dict(load_file(str(out)), strict=True)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reference(images), model(images), atol=1e-5, rtol=0)


def test_non_softmax_export_says_how_to_keep_the_normaliser(tmp_path, capsys):
    model = create("vit-micro", depth=1, attention="entmax15").eval()
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(20)  # sharp attention: entmax and softmax disagree
    save_model(model, tmp_path / "m.safetensors")
    out = tmp_path / "timm.safetensors"
    assert main(["export", "--model", str(tmp_path / "m.safetensors"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "timm will run it with softmax" in text and "attention='entmax15'" in text
    with safe_open(str(out), framework="pt") as handle:
        args = json.loads(handle.metadata()["timm_model_args"])
    images = torch.randn(2, 3, 32, 32)
    kept = load("timm:vit_tiny_patch16_224", weights=out, attention="entmax15", **args).eval()
    plain = load("timm:vit_tiny_patch16_224", weights=out, **args).eval()
    with torch.no_grad():
        torch.testing.assert_close(kept(images), model(images), atol=1e-5, rtol=0)
        assert not torch.allclose(plain(images), model(images), atol=1e-3)
    assert main(["export", "--model", "vit-micro", "--out", str(tmp_path / "x.pt")]) == 2
    assert ".safetensors" in capsys.readouterr().err
