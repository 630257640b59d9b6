"""The feature cache: same tensors as a direct forward, computed once, keyed by model, data and layer."""

import pytest
import torch

from vitscope.data import synthetic_scenes
from vitscope.models import create, load
from vitscope.probes.features import extract_features, parse_layers


@pytest.fixture(scope="module")
def scenes():
    return synthetic_scenes("train", num_images=12)


def _counted(model):
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_cached_features_equal_a_direct_forward_and_run_the_backbone_once(tmp_path, scenes):
    torch.manual_seed(0)
    model = create("vit-micro", num_registers=2).eval()
    calls = _counted(model)
    first = extract_features(model, scenes, "0,2,last", batch_size=5, cache=tmp_path, progress=False)
    assert len(calls) == 3  # 12 images in batches of 5: one pass for all three layers
    again = extract_features(model, scenes, [4, 2, 0], batch_size=5, cache=tmp_path, progress=False)
    assert len(calls) == 3  # every layer from the cache
    with torch.no_grad():
        images = (scenes.images.float() / 255 - torch.tensor(scenes.mean).view(1, 3, 1, 1)) \
            / torch.tensor(scenes.std).view(1, 3, 1, 1)
        embedded = model.embed(images)
        block2 = model.forward_intermediates(images, [1], norm=True)[0]
        last = model.forward_features(images)
    for layer, reference in ((0, model.norm(embedded)), (2, block2)):
        torch.testing.assert_close(again[layer].tokens.float(), reference, atol=2e-3, rtol=2e-3)
        assert torch.equal(again[layer].tokens, first[layer].tokens)
    torch.testing.assert_close(again[4].patches.float(), last["patches"], atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(again[4].cls.float(), last["cls"], atol=2e-3, rtol=2e-3)
    assert again[4].tokens.dtype == torch.float16
    assert again[4].registers.shape == (12, 2, 64) and again[4].patches.shape == (12, 64, 64)
    # another subset, another model or the un-normed tokens are other keys
    extract_features(model, scenes.subset(6), "last", batch_size=6, cache=tmp_path, progress=False)
    assert len(calls) == 4
    extract_features(model, scenes, "last", norm=False, batch_size=12, cache=tmp_path, progress=False)
    assert len(calls) == 5
    other = create("vit-micro", num_registers=2, attention="sparsemax").eval()
    other.load_state_dict(model.state_dict())
    other_calls = _counted(other)
    extract_features(other, scenes, "last", batch_size=12, cache=tmp_path, progress=False)
    assert len(other_calls) == 1
    # a forward hook (a planted outlier) changes the outputs but not the weights: it is part of the key
    model.blocks[3].register_forward_hook(lambda _m, _i, out: out * 2)
    extract_features(model, scenes, "last", batch_size=12, cache=tmp_path, progress=False)
    assert len(calls) == 6
    assert not list(tmp_path.glob(".*.tmp"))


def test_timm_model_with_registers_keeps_them_out_of_the_patch_grid(scenes):
    model = load("timm:vit_tiny_patch16_224", img_size=32, num_registers=3, patch_size=4, depth=2,
                 no_embed_class=True)  # timm adds registers only where CLS has no position (DeiT-III, DINOv2)
    features = extract_features(model, scenes.subset(4), "all", cache=False, progress=False)
    assert sorted(features) == [0, 1, 2]
    top = features[2]
    assert top.num_prefix_tokens == 4 and top.registers.shape == (4, 3, 192)
    assert top.patches.shape == (4, 64, 192) and top.grid == (8, 8)
    with torch.no_grad():
        expected = model.forward_features(torch.zeros(1, 3, 32, 32))
    assert expected.shape[1] == 4 + 64


def test_layer_spec_errors_name_the_valid_range():
    assert parse_layers("0,last", 8) == [0, 8] and parse_layers("all", 2) == [0, 1, 2]
    with pytest.raises(ValueError, match="0..4"):
        parse_layers("5", 4)
    with pytest.raises(ValueError, match="'first'"):
        parse_layers("first", 4)
