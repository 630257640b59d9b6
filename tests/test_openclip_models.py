"""OpenCLIP visual towers through open_clip:ARCH[@FILE]: maps against PyTorch's own attention weights."""

import pytest
import torch

import vitscope
from vitscope.models import load, token_layout

open_clip = pytest.importorskip("open_clip")

TINY = {"layers": 2, "width": 64, "head_width": 32, "image_size": 48}


def test_maps_equal_multihead_attention_weights_and_features_follow_ln_post(tmp_path):
    torch.manual_seed(0)
    model = load("open_clip:ViT-B-16", **TINY)
    assert token_layout(model).grid_size == (3, 3) and model.num_prefix_tokens == 1
    images = torch.randn(2, 3, 48, 48)
    inputs, want = [], []
    for block in model.blocks:  # PyTorch's own per-head weights on each block's attention input
        block.ln_1.register_forward_hook(lambda _m, _a, out: inputs.append(out))
    with torch.no_grad():
        expected = model(images)
        with vitscope.record_attention(model) as rec:
            out = model(images)
        for block, x in zip(model.blocks, inputs[-2:], strict=True):
            want.append(block.attn(x, x, x, need_weights=True, average_attn_weights=False)[1])
    assert torch.equal(out, expected)
    for got, ref in zip(rec.maps, want, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    features = model.forward_features(images)
    torch.testing.assert_close(features["patches"], model.visual.ln_post(features["prenorm"])[:, 1:])
    assert features["patches"].shape == (2, 9, 64)
    torch.save({f"visual.{k}": v for k, v in model.visual.state_dict().items()}, tmp_path / "clip.pt")
    again = load(f"open_clip:ViT-B-16@{tmp_path / 'clip.pt'}", **TINY)
    with torch.no_grad():
        torch.testing.assert_close(again(images), expected, atol=0, rtol=0)
    torch.save({"visual.extra": torch.zeros(1), **{f"visual.{k}": v for k, v in model.visual.state_dict().items()}},
               tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"bad.pt: the key 'extra' is not in the tower"):
        load(f"open_clip:ViT-B-16@{tmp_path / 'bad.pt'}", **TINY)
    by_weights = load("open_clip:ViT-B-16", weights=tmp_path / "clip.pt", **TINY)  # as a study's LABEL=SPEC@FILE
    with torch.no_grad():
        torch.testing.assert_close(by_weights(images), expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="not an OpenCLIP architecture"):
        load("open_clip:ViT-Q-99")


def test_the_probes_random_twin_reinitialises_every_weight():
    from vitscope.probes.baselines import random_twin

    torch.manual_seed(0)
    model = load("open_clip:ViT-B-16", **TINY)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(0.5)
    twin = random_twin(model)
    assert [k for k, v in twin.visual.state_dict().items() if v.numel() > 1 and torch.all(v == 0.5)] == []


def test_missing_open_clip_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "open_clip", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'vitscope\[open_clip\]'"):
        load("open_clip:ViT-B-16")
