"""timm families: recording with fused attention left on, geometry with known answers, modifications, weights."""

import math

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.layers.attention import Attention as TimmAttention

import vitscope
from kernel_spies import CountingKernels
from vitscope.attention import Attention, fast_paths, native
from vitscope.cli import main
from vitscope.metrics import attention_entropy, mean_attention_distance
from vitscope.models import attention_sites, load
from vitscope.models.capture.hierarchical import PvtReducedKeys, SwinWindows
from vitscope.models.capture.token_map import token_map
from vitscope.record import record_tokens

FAMILIES = {
    "dinov2-reg": ("timm:vit_small_patch14_reg4_dinov2", {"img_size": 56, "depth": 3}, 56),
    "swin": ("timm:swin_tiny_patch4_window7_224", {"img_size": 112, "depths": (2, 2, 2, 2)}, 112),
    "pvt-v2": ("timm:pvt_v2_b0", {}, 64),
    "clip": ("timm:vit_base_patch16_clip_224", {"img_size": 64, "depth": 2}, 64),
    "deit3": ("timm:deit3_small_patch16_224", {"img_size": 64, "depth": 2}, 64),
    "dino": ("timm:vit_small_patch16_224.dino", {"img_size": 64, "depth": 2, "pretrained": False}, 64),
}


def build(family):
    spec, options, size = FAMILIES[family]
    torch.manual_seed(0)
    return load(spec, **options).eval(), torch.randn(2, 3, size, size)


def attention_modules(model):
    return [m for m in model.modules() if hasattr(m, "fused_attn")]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_records_every_family_with_fused_attention_left_on(family):
    model, images = build(family)
    modules = attention_modules(model)
    fused_before = [m.fused_attn for m in modules]
    with torch.no_grad():
        expected = model(images)
        with vitscope.record_attention(model) as maps_rec:
            out = model(images)
        with vitscope.record_attention(model, keep="stats") as stats_rec:
            model(images)
    assert torch.equal(out, expected)  # no family changes its attention path while recorded
    assert [m.fused_attn for m in modules] == fused_before
    assert all(not m.attn_drop._forward_hooks and not m._forward_pre_hooks and not m._forward_hooks
               for m in modules)
    stats = stats_rec.stats
    assert len(maps_rec.maps) == len(stats.layers) == len(modules)
    for probs, layout, heads in zip(maps_rec.maps, maps_rec.layouts, stats.heads, strict=True):
        assert probs.shape[:2] == (2, heads)
        sums = probs.sum(-1)
        assert torch.all(sums <= 1 + 1e-5) and torch.all(sums > 0)  # Swin: mass on padded keys is dropped
        if layout.distances is not None:
            assert layout.distances.shape == probs.shape[-2:]
    assert not stats.mad[:, 0].isnan().any() and torch.all((stats.entropy[:, 0] > 0) & (stats.entropy[:, 0] <= 1))


def test_vit_maps_equal_an_independent_recomputation_and_registers_are_prefix_tokens():
    model, images = build("dinov2-reg")
    inputs = []
    hooks = [b.norm1.register_forward_hook(lambda _m, _i, out: inputs.append(out)) for b in model.blocks]
    with torch.no_grad(), vitscope.record_attention(model) as rec:
        model(images)
    for h in hooks:
        h.remove()
    for block, x, got in zip(model.blocks, inputs, rec.maps, strict=True):
        attn = block.attn
        b, t, c = x.shape
        q, k, _ = attn.qkv(x).reshape(b, t, 3, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)
        want = torch.softmax((q @ k.transpose(-2, -1)) * attn.scale, dim=-1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    layout = rec.layouts[0]
    assert (layout.num_prefix_tokens, layout.num_registers, layout.grid_size) == (5, 4, (4, 4))
    tokens = token_map(model)
    assert tokens["cls"] == [0] and tokens["registers"] == [1, 2, 3, 4] and tokens["patches"]["start"] == 5


def swin_brute_force(h, w, win, shift, keep_padding_out=True):
    """Mean distance from each real token to the real members of its window, by simulation."""
    hp, wp = math.ceil(h / win) * win, math.ceil(w / win) * win
    index = np.arange(h * w).reshape(h, w)
    shifted = np.roll(index, (-shift, -shift), axis=(0, 1))
    padded = np.full((hp, wp), -1)
    padded[:h, :w] = shifted
    per_token = []
    for r in range(0, hp, win):
        for c in range(0, wp, win):
            members = [v for v in padded[r : r + win, c : c + win].ravel() if v >= 0]
            coords = np.array([divmod(v, w) for v in members], dtype=float)
            for p in coords:
                per_token.append(np.linalg.norm(coords - p, axis=1).mean())
    return float(np.mean(per_token))


@pytest.mark.parametrize("h,win,shift", [(8, 4, 0), (8, 4, 2), (6, 4, 0), (7, 3, 1)])
def test_swin_window_geometry_known_answers(h, win, shift):
    geometry = SwinWindows((h, h), (win, win), (shift, shift), stride=4)
    windows = math.ceil(h / win) ** 2
    uniform = torch.full((2 * windows, 3, win * win, win * win), 1.0 / (win * win))
    probs, layout = geometry(uniform)
    assert probs.shape == (2, 3, h * h, win * win)
    mad = mean_attention_distance(probs, num_prefix_tokens=0, distances=layout.distances, unit="patch")
    torch.testing.assert_close(mad, torch.full((2, 3), swin_brute_force(h, h, win, shift)), atol=1e-5, rtol=0)
    self_only = torch.eye(win * win).expand(2 * windows, 3, -1, -1)
    probs, layout = geometry(self_only)
    assert torch.all(mean_attention_distance(probs, num_prefix_tokens=0, distances=layout.distances) == 0)
    assert torch.all(attention_entropy(probs, num_prefix_tokens=0) == 0)


def test_pvt_reduced_keys_geometry_known_answer():
    model, _ = build("pvt-v2")
    attn = model.stages[0].blocks[0].attn  # stride 4 px, keys reduced by 8
    geometry = PvtReducedKeys(attn, stride=4)
    geometry.feat_size = (16, 16)
    reduction = attn.sr.stride[0]
    keys = (16 // reduction) ** 2
    probs, layout = geometry(torch.full((1, 1, 256, keys), 1.0 / keys))
    q = [((i + 0.5) * 4, (j + 0.5) * 4) for i in range(16) for j in range(16)]
    k = [((a * reduction + reduction / 2) * 4, (b * reduction + reduction / 2) * 4)
         for a in range(16 // reduction) for b in range(16 // reduction)]
    expected = np.mean([[math.dist(p, c) for c in k] for p in q])
    mad = mean_attention_distance(probs, num_prefix_tokens=0, distances=layout.distances, unit="pixel", patch_size=1)
    assert mad.item() == pytest.approx(expected, rel=1e-5)


def tiny_hierarchical(family):
    """Random-init Swin (padded, shifted windows) and PVT-v2 (reduced keys), small enough to run twice a test."""
    torch.manual_seed(0)
    if family == "swin":
        model = timm.create_model("swin_tiny_patch4_window7_224", img_size=40, depths=(2, 2), embed_dim=16,
                                  num_heads=(1, 2), window_size=4)
        return model.eval(), torch.randn(2, 3, 40, 40)
    return load("timm:pvt_v2_b0").eval(), torch.randn(2, 3, 64, 64)


def manual_path_maps(model, images):
    """Each attention layer's own probabilities on timm's manual path, in canonical form."""
    modules, raw = attention_modules(model), []
    before = [m.fused_attn for m in modules]
    hooks = [m.attn_drop.register_forward_hook(lambda _m, inputs, _out: raw.append(inputs[0])) for m in modules]
    for m in modules:
        m.fused_attn = False
    with torch.no_grad():
        model(images)
    for m, fused, hook in zip(modules, before, hooks, strict=True):
        m.fused_attn = fused
        hook.remove()
    # Swin's windows become canonical rows; PVT's probabilities are canonical as they are
    return [site.canonical(probs)[0] if isinstance(site.canonical, SwinWindows) else probs
            for site, probs in zip(attention_sites(model), raw, strict=True)]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("family", ["swin", "pvt-v2"])
def test_hierarchical_outputs_bit_identical_and_maps_equal_the_manual_path(family, fused):
    model, images = tiny_hierarchical(family)
    for m in attention_modules(model):
        m.fused_attn = fused  # Swin's default is the manual path (timm's fused path is experimental there)
    with torch.no_grad(), fast_paths(compiled=False):  # Swin's statistics come from its maps: no compiler run
        plain = model(images)
        for keep in ("maps", "stats"):
            with vitscope.record_attention(model, keep=keep) as rec:
                assert torch.equal(model(images), plain)
            if keep == "maps":
                maps = rec.maps
    assert all(m.fused_attn == fused for m in attention_modules(model))
    want = manual_path_maps(model, images)
    assert len(maps) == len(want) == len(attention_modules(model))
    for got, expected in zip(maps, want, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_pvt_statistics_from_queries_and_keys_equal_those_of_its_maps():
    model, images = tiny_hierarchical("pvt-v2")
    spy = CountingKernels()
    with torch.no_grad(), fast_paths(kernels=spy):
        with vitscope.record_attention(model, keep="maps") as maps_rec:
            model(images)
        with vitscope.record_attention(model, keep="stats", unit="pixel") as rec:
            model(images)
    if native.library() is not None:
        assert spy.calls == ["softmax_locality"] * len(maps_rec.maps)  # rectangular q/k kernel, no maps formed
    for layer, (probs, layout) in enumerate(zip(maps_rec.maps, maps_rec.layouts, strict=True)):
        heads = probs.shape[1]
        mad = mean_attention_distance(probs, num_prefix_tokens=0, distances=layout.distances, unit="pixel",
                                      patch_size=1)
        torch.testing.assert_close(rec.stats.mad[layer, :heads], mad.mean(0), atol=1e-4, rtol=1e-5)
        ent = attention_entropy(probs, num_prefix_tokens=0)
        torch.testing.assert_close(rec.stats.entropy[layer, :heads], ent.mean(0), atol=2e-6, rtol=0)


def test_an_attention_whose_projections_are_not_timms_is_refused_clearly():
    model, images = tiny_hierarchical("pvt-v2")
    del model.stages[0].blocks[0].attn.kv  # as if a timm version had renamed it
    with pytest.raises(ValueError, match="cannot record this PVT-v2 attention .* lacks kv"):
        with vitscope.record_attention(model):
            pass
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in attention_modules(model))


def test_everything_restored_after_an_error():
    model, images = build("pvt-v2")
    modules = attention_modules(model)
    for m in modules[::2]:  # a user's own mix of settings must come back exactly
        m.fused_attn = not m.fused_attn
    before = [m.fused_attn for m in modules]
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), vitscope.record_attention(model):
        model(images)
        raise RuntimeError("boom")
    assert [m.fused_attn for m in modules] == before
    assert all(not m._forward_pre_hooks and not m._forward_hooks and not m.q._forward_hooks
               and not m.kv._forward_hooks for m in modules)


def test_swap_normaliser_keeps_weights_and_registers_and_image_size():
    torch.manual_seed(0)
    base = load("timm:deit3_small_patch16_224", img_size=64, depth=2).eval()
    images = torch.randn(2, 3, 64, 64)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    same = load("timm:deit3_small_patch16_224", img_size=64, depth=2, attention="softmax").eval()
    same.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(same(images), base(images), atol=1e-5, rtol=0)
    sparse = load("timm:deit3_small_patch16_224", img_size=64, depth=2, attention="entmax15", num_registers=2).eval()
    sparse.load_state_dict(state, strict=False)
    assert all(isinstance(b.attn, Attention) and b.attn.normalizer.name == "entmax15" for b in sparse.blocks)
    assert sparse.num_prefix_tokens == 3 and sparse.num_reg_tokens == 2
    seen = []
    handle = sparse.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad(), vitscope.record_attention(sparse, keep="stats") as rec:
        sparse(images)
    handle.remove()
    torch.testing.assert_close(seen[0][:, 1:3], sparse.reg_token.expand(2, -1, -1))
    assert rec.stats.mad.shape == (2, 6) and (sparse.blocks[0].attn.observer is None)
    assert token_map(sparse)["registers"] == [1, 2]
    with torch.no_grad(), vitscope.record_attention(sparse) as maps:
        sparse(images)
    assert (maps.maps[0] == 0).any()  # entmax gives exact zeros
    assert maps.maps[0].shape[-1] == 3 + 16


def test_local_weights_timm_and_original_dinov2_names(tmp_path, monkeypatch):
    model, images = build("dinov2-reg")
    state = model.state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    torch.save({"model": state}, tmp_path / "w.pth")
    original = {k: v for k, v in state.items() if k not in ("reg_token", "cls_token", "pos_embed")}
    original["register_tokens"] = state["reg_token"]
    original["pos_embed"] = torch.cat([torch.zeros_like(state["pos_embed"][:, :1]), state["pos_embed"]], dim=1)
    original["cls_token"] = state["cls_token"]
    original["mask_token"] = torch.zeros(1, state["cls_token"].shape[-1])
    torch.save(original, tmp_path / "original.pth")
    spec, options, _ = FAMILIES["dinov2-reg"]
    with torch.no_grad():
        want = model(images)
        for name in ("w.safetensors", "w.pth", "original.pth"):
            got = load(spec, weights=tmp_path / name, **options).eval()(images)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # pretrained weights: only from the cache
    with pytest.raises(ValueError, match=r"timm:vit_small_patch14_reg4_dinov2 is not in the local cache .*"
                                         r"`hf download timm/vit_small_patch14_reg4_dinov2.lvd142m model.safetensors`"):
        load(spec, pretrained=True)
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        load(spec, weights=tmp_path / "missing.pth", **options)


def test_record_tokens_before_and_after_the_final_norm():
    model, images = build("dinov2-reg")
    with torch.no_grad(), record_tokens(model, layers=[-1]) as rec:
        feats = model.forward_features(images)
    torch.testing.assert_close(rec.normed[0], feats, atol=1e-5, rtol=0)
    torch.testing.assert_close(rec.norms[0], rec.tokens[0].norm(dim=-1))
    swin, swin_images = build("swin")
    with torch.no_grad(), record_tokens(swin, keep="norms") as rec:
        swin(swin_images)
    assert rec.norms[0].shape == (2, 28 * 28) and rec.normed_norms[0] is None


def write_folder(root, count=6, size=40):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(count // 2):
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


@pytest.mark.parametrize("model,extra", [("timm:vit_small_patch14_reg4_dinov2", ["--img-size", "56"]),
                                         ("timm:swin_tiny_patch4_window7_224", ["--img-size", "112"])])
def test_cli_analyze_on_timm_models_and_a_dataset_on_disk(tmp_path, monkeypatch, model, extra):
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    write_folder(tmp_path / "data")
    common = ["--model", model, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "data"), "--device", "cpu",
              "--batch-size", "4", *extra]
    assert main(["analyze", "locality", *common, "--out", str(tmp_path / "loc")]) == 0
    assert main(["analyze", "norms", *common, "--threshold", "auto", "--out", str(tmp_path / "norms")]) == 0
    assert (tmp_path / "loc" / "mad_per_layer.png").is_file() and (tmp_path / "loc" / "locality.csv").is_file()
    assert (tmp_path / "norms" / "norm_histograms.png").is_file() and (tmp_path / "norms" / "norms.csv").is_file()


class GatedTimmAttention(TimmAttention):
    """timm's Attention with its sigmoid output gate on (timm's ViTs take it through attn_layer=)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, gated=True, **kwargs)


VARIANTS = {  # each attention variant of timm's ViT family that vitscope converts, tiny
    "plain": ("timm:deit3_small_patch16_224", {}),
    "qk-norm": ("timm:vit_small_patch16_224", {"qk_norm": True}),
    "gated": ("timm:vit_small_patch16_224", {"attn_layer": GatedTimmAttention}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_attention_variants_convert_with_their_weights_and_record_bit_identically(variant):
    spec, extra = VARIANTS[variant]
    options = {"img_size": 32, "depth": 2, **extra}
    torch.manual_seed(0)
    timm_model = load(spec, **options).eval()
    images = torch.randn(2, 3, 32, 32)
    converted = load(spec, attention="softmax", **options).eval()
    converted.load_state_dict(timm_model.state_dict())  # strict: the same parameters under the same names
    attn = converted.blocks[0].attn
    assert isinstance(attn, Attention) and attn.normalizer.name == "softmax"
    assert (attn.gate is not None) == (variant == "gated") and isinstance(attn.q_norm, torch.nn.Identity) == (
        variant != "qk-norm")
    with torch.no_grad():
        want = timm_model(images)
        torch.testing.assert_close(converted(images), want, atol=1e-6, rtol=1e-6)
        for model in (timm_model, converted):  # recording changes nothing, to the bit
            plain = model(images)
            with vitscope.record_attention(model, keep="stats") as rec:
                assert torch.equal(model(images), plain)
            with vitscope.record_attention(model) as maps:
                assert torch.equal(model(images), plain)
            assert not rec.stats.mad.isnan().any() and maps.maps[0].shape == (2, 6, 5, 5)
    sparse = load(spec, attention="entmax15", **options).eval()
    sparse.load_state_dict(timm_model.state_dict())
    assert all(b.attn.normalizer.name == "entmax15" for b in sparse.blocks)


@pytest.mark.parametrize("spec,options,match", [
    ("timm:vit_dwee_patch16_reg1_gap_256", {"depth": 1}, "DiffAttention"),
    ("timm:vit_small_patch16_18x2_224", {"depth": 1}, "do not each hold one"),
    ("timm:vit_base_patch16_xp_224", {"depth": 1}, "no timm ViT Attention"),
    ("timm:swin_tiny_patch4_window7_224", {"depths": (1, 1, 1, 1)}, "WindowAttention"),
])
def test_attention_that_cannot_be_converted_is_refused(spec, options, match):
    with pytest.raises(ValueError, match=match):
        load(spec, attention="entmax15", **options)


def test_registers_only_where_timm_gives_them_no_positional_embedding():
    with pytest.raises(ValueError, match="no_embed_class"):
        load("timm:vit_small_patch16_224.dino", num_registers=4, img_size=32, depth=1, pretrained=False)
    with pytest.raises(ValueError, match="already has registers"):
        load("timm:vit_small_patch14_reg4_dinov2", num_registers=4, img_size=28, depth=1)


@pytest.mark.parametrize("with_weights", [False, True])
def test_an_image_size_off_the_patch_grid_is_refused_before_anything_is_read(tmp_path, with_weights, capsys):
    """225 px at patch 14 was built as a cut-down 16 x 16 grid (timm floors it) and recorded as 225 when weights were
    given (issue 46, item 16): refused in one line naming the two sizes around it, in Python and in the CLI."""
    spec, options, _ = FAMILIES["dinov2-reg"]
    weights = None
    if with_weights:
        model = load(spec, **options)
        weights = tmp_path / "w.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    with pytest.raises(ValueError, match=r"img_size=225 is not a multiple of .*patch size 14; .*224 or 238"):
        load(spec, weights=weights, **{**options, "img_size": 225})
    extra = ["--weights", str(weights)] if with_weights else []
    code = main(["analyze", "locality", "--model", spec, *extra, "--img-size", "225", "--dataset", "synthetic",
                 "--num-images", "2", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "img_size=225 is not a multiple" in err[-1] and "224 or 238" in err[-1]
    assert not (tmp_path / "out" / "results.json").exists()


def test_an_overlapping_patch_embedding_takes_any_size():
    """PVT-v2 embeds with a padded 7 x 7 convolution at stride 4: 64 px is no multiple of 7 and is no grid error
    (the size check refused it, and the registers demo exited 2 on its PVT-v2 model)."""
    from vitscope.models.adapters.timm import check_timm_img_size

    assert check_timm_img_size("pvt_v2_b0", 64, {}) == 64
    with pytest.raises(ValueError, match="patch size 14"):
        check_timm_img_size("vit_small_patch14_dinov2", 225, {})
