"""record_attention: maps equal timm's manual path, stats equal the metrics, the model is left untouched."""

import pytest
import timm
import torch

import vitscope
from vitscope.attention import AttentionEvent
from vitscope.metrics import SupportAccumulator, attention_entropy, mean_attention_distance
from vitscope.models import create


@pytest.fixture
def images():
    torch.manual_seed(0)
    return torch.randn(3, 3, 32, 32)


def timm_manual_maps(model, images):
    """Attention probabilities from timm's manual attention path, given our weights."""
    cfg = model.cfg
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=cfg.num_classes, embed_dim=cfg.embed_dim,
        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio).eval()
    ref.load_state_dict(model.state_dict())
    maps = []
    for block in ref.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _m, inputs, _out: maps.append(inputs[0].detach()))
    with torch.no_grad():
        ref(images)
    return maps


def test_maps_equal_timm_manual_path_with_fused_attention_on(images):
    model = create("vit-micro").eval()
    assert all(block.attn.fused for block in model.blocks)
    with torch.no_grad(), vitscope.record_attention(model) as rec:
        logits = model(images)
    expected = timm_manual_maps(model, images)
    assert len(rec.maps) == len(expected) == 4
    for got, want in zip(rec.maps, expected, strict=True):
        assert got.shape == (3, 4, 65, 65)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(images), logits, atol=1e-5, rtol=0)  # output unchanged by recording


def test_layer_selection_and_batches_concatenate(images):
    model = create("vit-micro").eval()
    with torch.no_grad(), vitscope.record_attention(model, layers=[0, -1]) as rec:
        model(images)
        model(images[:1])
    assert [m.shape[0] for m in rec.maps] == [4, 4]
    assert [site.index for site in rec.sites] == [0, 3]


@pytest.mark.parametrize("attention", ["softmax", "sparsemax", "entmax15", "entmax:1.3"])
def test_stats_equal_metrics_over_all_batches(images, attention):
    model = create("vit-micro", attention=attention, num_registers=2).eval()
    torch.manual_seed(5)
    more = torch.randn(5, 3, 32, 32)
    with torch.no_grad(), vitscope.record_attention(model, keep="maps") as maps_rec:
        model(images)
        model(more)
    with torch.no_grad(), vitscope.record_attention(model, keep="stats", unit="patch") as rec:
        model(images)
        model(more)
    stats = rec.stats
    assert stats.mad.shape == (4, 4) and stats.images.tolist() == [8] * 4
    for layer, probs in enumerate(maps_rec.maps):
        mad = mean_attention_distance(probs, (8, 8), num_prefix_tokens=3, unit="patch")
        ent = attention_entropy(probs, num_prefix_tokens=3)
        torch.testing.assert_close(stats.mad[layer], mad.nanmean(0), atol=1e-5, rtol=0)
        torch.testing.assert_close(stats.entropy[layer], ent.nanmean(0), atol=1e-5, rtol=0)
    assert rec._maps == [[] for _ in rec.sites]  # nothing kept: memory does not grow with the data
    rows = stats.rows()
    assert rows[0]["layer"] == 1 and rows[0]["head"] == 1 and len(rows) == 16


def test_stats_count_and_skip_heads_without_patch_mass():
    model = create("vit-micro", num_registers=1, attention="sparsemax").eval()  # manual path: observer

    def all_on_cls(event):
        probs = torch.zeros_like(event.probs)
        probs[..., 0] = 1.0
        return AttentionEvent(event.q, event.k, event.scale, event.attn_mask, event.normalizer, probs)

    stats_rec = vitscope.record_attention(model, layers=[0], keep="stats")
    with torch.no_grad(), stats_rec as rec:
        # a probe observer placed before ours rewrites the maps: every query looks only at CLS
        site_module = model.blocks[0].attn
        ours = site_module.observer
        site_module.observer = lambda event: ours(all_on_cls(event))
        model(torch.randn(2, 3, 32, 32))
        site_module.observer = ours
    assert rec.stats.skipped.tolist() == [[2, 2, 2, 2]]
    assert rec.stats.mad.isnan().all()


def test_model_left_exactly_as_it_was_also_on_error(images):
    model = create("vit-micro").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="boom"), vitscope.record_attention(model, keep="stats"):
        model(images)
        raise RuntimeError("boom")
    assert all(block.attn.observer is None and block.attn.fused for block in model.blocks)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_arguments():
    model = create("vit-micro")
    with pytest.raises(ValueError, match="keep"):
        with vitscope.record_attention(model, keep="everything"):
            pass
    with pytest.raises(ValueError, match="out of range"):
        with vitscope.record_attention(model, layers=[9]):
            pass
    with pytest.raises(ValueError, match="cannot record attention"):
        with vitscope.record_attention(torch.nn.Linear(2, 2)):
            pass
    with vitscope.record_attention(model, keep="stats") as rec:
        pass
    with pytest.raises(ValueError, match="no forward pass"):
        _ = rec.stats


def test_stats_honour_an_attention_mask_on_the_fused_path():
    model = create("vit-micro").eval()
    attn = model.blocks[0].attn
    torch.manual_seed(3)
    tokens = torch.randn(2, 65, 64)
    mask = torch.rand(65, 65) > 0.3
    mask.fill_diagonal_(True)
    with torch.no_grad(), vitscope.record_attention(model, layers=[0]) as maps:
        attn(tokens, attn_mask=mask)
    probs = maps.maps[0]
    assert torch.all(probs[..., ~mask] == 0)
    with torch.no_grad(), vitscope.record_attention(model, layers=[0], keep="stats", unit="patch") as rec:
        attn(tokens, attn_mask=mask)
    want = mean_attention_distance(probs, (8, 8), num_prefix_tokens=1, unit="patch").mean(0)
    torch.testing.assert_close(rec.stats.mad[0], want, atol=1e-5, rtol=0)


def test_outputs_bit_identical_with_and_without_recording(images):
    torch.manual_seed(1)
    models = [create("vit-micro", num_registers=1).eval(),
              timm.create_model("deit3_small_patch16_224", img_size=32, depth=2, qk_norm=True).eval()]
    for model in models:
        with torch.no_grad():
            plain = model(images)
            for keep in ("maps", "stats"):
                with vitscope.record_attention(model, keep=keep, accumulators=[SupportAccumulator()]):
                    assert torch.equal(model(images), plain)


class MassOnCls:
    """A metric the recorder has never heard of: per head, the attention mass patch queries put on CLS."""

    def __init__(self):
        self.seen = {}

    def update(self, layer, batch):
        self.seen.setdefault(layer, []).append(batch.probs()[:, :, batch.prefix:, 0].mean(-1))


@pytest.mark.parametrize("attention", ["softmax", "sparsemax"])
def test_extra_accumulators_see_every_layer_and_batch(images, attention):
    model = create("vit-micro", attention=attention, num_registers=1).eval()
    support, mass = SupportAccumulator(), MassOnCls()
    with torch.no_grad(), vitscope.record_attention(model, keep="maps") as maps_rec:
        model(images)
        model(images[:2])
    with torch.no_grad(), vitscope.record_attention(model, layers=[1, 3], keep="stats",
                                                    accumulators=[support, mass]) as rec:
        model(images)
        model(images[:2])
    assert rec.stats.mad.shape == (2, 4) and sorted(mass.seen) == [1, 3]
    for layer in (1, 3):
        probs = maps_rec.maps[layer]  # (5, heads, T, T), brute force below
        patch = probs[:, :, 2:, 2:]
        want_zeros = (patch == 0).float().mean(dim=(-1, -2)).mean(0)
        want_support = (patch != 0).float().sum(-1).mean(-1).mean(0)
        torch.testing.assert_close(support.zeros(layer), want_zeros, atol=1e-6, rtol=0)
        torch.testing.assert_close(support.support(layer), want_support, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.cat(mass.seen[layer]), probs[:, :, 2:, 0].mean(-1), atol=1e-6, rtol=0)
    if attention == "softmax":
        assert support.zeros(1).max() == 0 and support.support(1).min() == 64
    else:
        assert support.zeros(1).min() > 0.2  # sparsemax gives exact zeros, even at random initialisation
    with pytest.raises(ValueError, match="no update"):
        with vitscope.record_attention(model, accumulators=[object()]):
            pass
