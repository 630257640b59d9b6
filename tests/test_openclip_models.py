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


def odd_photos(count=4):
    """uint8 photos (3, H, W) and their PIL images at odd sizes (the issue's 333 x 257 among them)."""
    from PIL import Image

    rng = torch.Generator().manual_seed(3)
    out = []
    for h, w in [(333, 257), (257, 333), (224, 224), (301, 300)][:count]:
        small = (torch.rand(3, 9, 7, generator=rng) * 255).byte().permute(1, 2, 0).numpy()
        photo = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        out.append((torch.from_numpy(__import__("numpy").asarray(photo).copy()).permute(2, 0, 1), photo))
    return out


def levels_from(transformed, cfg):
    """OpenCLIP's normalised output back in uint8 levels."""
    std, mean = (torch.tensor(cfg[k])[:, None, None] for k in ("std", "mean"))
    return (transformed * std + mean) * 255


def test_views_are_openclips_own_preprocess_shortest_and_squash_on_any_dataset(tmp_path, monkeypatch):
    """A tower is fed what OpenCLIP's own eval transform makes of a photo: ``create_model_and_transforms``'s for a
    plain architecture (shortest side, centre crop, bicubic), and for a tag whose registry entry says
    ``resize_mode: squash`` (ViT-H-14/dfn5b) the stretched view that entry gives; crop 1 on ImageNet's layouts too
    (where a model naming no crop would get 0.875)."""
    import hashlib
    import os
    from dataclasses import asdict

    from safetensors.torch import save_file

    from vitscope.data.pixels import model_view

    _, _, preprocess = open_clip.create_model_and_transforms("ViT-S-32", pretrained=None)
    tower = load("open_clip:ViT-S-32", layers=1)
    for dataset in ("imagefolder", "imagenet", "shards"):
        view = model_view(tower, dataset)
        assert (view.size, view.scale_size, view.resize) == (224, 224, "shortest"), dataset
    cfg = tower.visual.preprocess_cfg
    for pixels, photo in odd_photos():
        diff = (model_view(tower, "imagenet")(pixels).float() - levels_from(preprocess(photo), cfg)).abs()
        assert diff.mean() < 0.05 and diff.max() <= 2.01  # PIL's bicubic against torchvision's, in levels

    # a tag's registry entry: ViT-H-14/dfn5b is squashed; a tiny tower of that architecture from a fake cache
    from open_clip import pretrained as registry
    from open_clip.transform import PreprocessCfg, image_transform_v2, merge_preprocess_dict

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    small = {"layers": 1, "width": 64, "head_width": 32, "image_size": 224, "patch_size": 14}
    reference = load("open_clip:ViT-H-14", **small)
    save_file({f"visual.{k}": v.contiguous() for k, v in reference.visual.state_dict().items()},
              str(tmp_path / "w.safetensors"))
    entry = registry.get_pretrained_cfg("ViT-H-14", "dfn5b")
    repo, filename = os.path.split(entry["hf_hub"])
    snapshot = tmp_path / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    blob = snapshot.parent.parent / "blobs" / hashlib.sha256((tmp_path / "w.safetensors").read_bytes()).hexdigest()
    blob.parent.mkdir()
    blob.write_bytes((tmp_path / "w.safetensors").read_bytes())
    (snapshot / (filename or "open_clip_model.safetensors")).symlink_to(blob)
    tower = load("open_clip:ViT-H-14/dfn5b", **small)
    theirs_cfg = {**merge_preprocess_dict(asdict(PreprocessCfg()), entry), "size": 224}
    assert theirs_cfg["resize_mode"] == "squash"
    transform = image_transform_v2(PreprocessCfg(**theirs_cfg), is_train=False)
    view = model_view(tower, "shards")
    assert (view.resize, view.scale_size, view.size) == ("squash", 224, 224)
    for pixels, photo in odd_photos():
        diff = (view(pixels).float() - levels_from(transform(photo), theirs_cfg)).abs()
        assert diff.mean() < 0.05 and diff.max() <= 2.01
