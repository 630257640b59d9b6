"""vitscope export --format timm: timm's VisionTransformer built from the written arguments gives our logits."""

import json

import numpy as np
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


def test_export_hf_writes_the_view_that_reloads_to_the_same_view(tmp_path):
    """A timm ViT with crop_pct 0.9 (bicubic): the exported folder's image processor, as transformers'
    AutoImageProcessor reads it, gives the view vitscope gave the model before the export, and hf: reloads that
    view (the 0.9 crop survives; the old export stretched the whole picture to 224 x 224, crop 1.0)."""
    from PIL import Image
    from transformers import AutoImageProcessor

    from vitscope.data.pixels import model_view
    from vitscope.models.export.hf import export_hf

    torch.manual_seed(0)
    model = load("timm:vit_small_patch16_224", depth=1, embed_dim=32, num_heads=2).eval()
    assert (model.pretrained_cfg["crop_pct"], model.pretrained_cfg["interpolation"]) == (0.9, "bicubic")
    export_hf(model, tmp_path / "hf")
    twin = load(f"hf:{tmp_path / 'hf'}")
    before, after = model_view(model), model_view(twin)
    assert (after.size, after.scale_size, after.resize, after.interpolation) == (224, 248, "shortest", "bicubic")
    assert (before.size, before.scale_size, before.resize, before.interpolation) == (224, 248, "shortest", "bicubic")
    rng = torch.Generator().manual_seed(2)
    # (height, width): the crop excess of each is a multiple of 4 or 1 modulo 4, where torchvision's CenterCrop
    # (timm) and transformers' agree to the pixel (3 modulo 4 would put transformers' cut one pixel earlier)
    for h, w in [(333, 257), (257, 333), (224, 224), (301, 300)]:
        small = (torch.rand(3, 9, 7, generator=rng) * 255).byte().permute(1, 2, 0).numpy()
        photo = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        pixels = torch.from_numpy(np.asarray(photo).copy()).permute(2, 0, 1)
        processor = AutoImageProcessor.from_pretrained(tmp_path / "hf", do_rescale=False, do_normalize=False)
        theirs = processor(pixels, return_tensors="pt")["pixel_values"][0]
        assert torch.equal(after(pixels), before(pixels))
        assert (after(pixels).float() - theirs).abs().mean() < 0.05  # uint8 levels
