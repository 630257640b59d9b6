"""Hugging Face transformers models through hf:FOLDER: tiny random configs saved with save_pretrained, recorded with
the model's SDPA attention on, checked against transformers' eager attention with output_attentions=True."""

import json
import sys

import pytest
import torch

import vitscope
from vitscope.models import load, token_layout
from vitscope.models.capture.token_map import token_map

transformers = pytest.importorskip("transformers")

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
CLASSES = {  # class: (config options, prefix tokens, registers); 48 px, 16 px patches: a 3 x 3 grid
    "ViTModel": ({"image_size": 48, "patch_size": 16}, 1, 0),
    "DeiTModel": ({"image_size": 48, "patch_size": 16}, 2, 0),
    "Dinov2Model": ({"image_size": 48, "patch_size": 16}, 1, 0),
    "Dinov2WithRegistersModel": ({"image_size": 48, "patch_size": 16, "num_register_tokens": 2}, 3, 2),
    "DINOv3ViTModel": ({"image_size": 48, "patch_size": 16, "num_register_tokens": 4}, 5, 4),
    "CLIPVisionModel": ({"image_size": 48, "patch_size": 16}, 1, 0),
    "SiglipVisionModel": ({"image_size": 48, "patch_size": 16}, 0, 0),
    "Siglip2VisionModel": ({"num_patches": 9, "patch_size": 16}, 0, 0),
}


def save(tmp_path, name, seed=0):
    options, _, _ = CLASSES[name]
    cls = getattr(transformers, name)
    torch.manual_seed(seed)
    model = cls(cls.config_class(**SMALL, **options))
    with torch.no_grad():  # random LayerNorms and biases, so that a wrong norm or offset cannot pass
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    folder = tmp_path / name
    model.save_pretrained(folder)
    return folder


def eager_outputs(folder, name, images, adapter):
    reference = getattr(transformers, name).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return reference(**adapter._inputs(images), output_attentions=True)


@pytest.mark.parametrize("name", list(CLASSES))
def test_maps_and_features_equal_transformers_eager_attention(tmp_path, name):
    folder = save(tmp_path, name)
    model = load(f"hf:{folder}")
    assert model.hf.config._attn_implementation == "vitscope_sdpa"  # SDPA, observed
    _, prefix, registers = CLASSES[name]
    layout = token_layout(model)
    assert (layout.num_prefix_tokens, layout.num_registers, layout.grid_size) == (prefix, registers, (3, 3))
    images = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        plain = model.forward_features(images)
        with vitscope.record_attention(model) as rec, vitscope.record_attention(model, keep="stats") as stats:
            features = model.forward_features(images)
    assert all(torch.equal(features[k], plain[k]) for k in ("patches", "prenorm"))  # recording changes nothing
    want = eager_outputs(folder, name, images, model)
    assert len(rec.maps) == len(want.attentions) == 2
    for got, ref in zip(rec.maps, want.attentions, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    hidden = want.last_hidden_state
    if name == "CLIPVisionModel":  # CLIP's last_hidden_state is before post_layernorm
        torch.testing.assert_close(features["prenorm"], hidden, atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(features["patches"], hidden[:, prefix:], atol=1e-5, rtol=0)
        torch.testing.assert_close(features["registers"], hidden[:, prefix - registers:prefix], atol=1e-5, rtol=0)
        if prefix:
            torch.testing.assert_close(features["cls"], hidden[:, 0], atol=1e-5, rtol=0)
    assert stats.stats.mad.shape == (2, 2) and not stats.stats.mad.isnan().any()
    blocks = model.forward_intermediates(images, [0, 1])
    torch.testing.assert_close(blocks[-1], features["prenorm"], atol=1e-6, rtol=0)


def test_registers_are_prefix_tokens_after_cls(tmp_path):
    model = load(f"hf:{save(tmp_path, 'DINOv3ViTModel')}")
    tokens = token_map(model)
    assert tokens["cls"] == [0] and tokens["registers"] == [1, 2, 3, 4] and tokens["patches"]["start"] == 5


@pytest.mark.parametrize("name", list(CLASSES))
def test_cli_analysis_end_to_end(tmp_path, monkeypatch, capsys, name):
    from vitscope.cli import main

    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    folder = save(tmp_path, name)
    common = ["--model", f"hf:{folder}", "--dataset", "synthetic", "--num-images", "2", "--batch-size", "2",
              "--device", "cpu"]
    assert main(["analyze", "locality", *common, "--out", str(tmp_path / "loc")]) == 0
    loc = json.loads((tmp_path / "loc" / "locality.json").read_text())
    assert loc["provenance"]["config"]["model_load"]["origin"] == f"hf {name}"
    assert f"origin hf {name}" in capsys.readouterr().err
    if name == "Dinov2WithRegistersModel":
        assert main(["analyze", "norms", *common, "--threshold", "auto", "--out", str(tmp_path / "norms")]) == 0
        norms = json.loads((tmp_path / "norms" / "norms.json").read_text())
        assert norms["tokens"]["registers"] == [1, 2] and norms["tokens"]["patches"]["grid"] == [3, 3]


def test_random_architecture_hub_names_and_the_missing_extra(tmp_path, monkeypatch):
    model = load("hf:Dinov2Model", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                 image_size=32, patch_size=16)
    assert token_layout(model).grid_size == (2, 2)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # hub names: only from the cache
    with pytest.raises(ValueError, match=r"hf:facebook/dinov2-small is not in the local cache .*fetch it with "
                                         r"`hf download facebook/dinov2-small`, or rerun with --download"):
        load("hf:facebook/dinov2-small")
    with pytest.raises(ValueError, match="num_hiden_layers not in Dinov2Config"):
        load("hf:Dinov2Model", num_hiden_layers=2)
    with pytest.raises(ValueError, match="does not take num_registers="):
        load(f"hf:{tmp_path}", num_registers=2)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'vitscope\[hf\]'"):
        load("hf:Dinov2Model")


@pytest.mark.parametrize("name", ["ViTModel", "DINOv3ViTModel", "Siglip2VisionModel"])
def test_a_non_native_non_square_input_follows_its_grid(tmp_path, name):
    folder = save(tmp_path, name)
    model = load(f"hf:{folder}")
    images = torch.randn(1, 3, 64, 80)  # a 4 x 5 grid (positions interpolated by the model's own code, or RoPE)
    with torch.no_grad(), vitscope.record_attention(model) as rec:
        model.forward_features(images)
    assert rec.layouts[0].grid_size == (4, 5)
    want = eager_outputs(folder, name, images, model)
    for got, ref in zip(rec.maps, want.attentions, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_the_probes_random_twin_reinitialises_every_weight(tmp_path):
    from vitscope.probes.baselines import random_twin

    model = load(f"hf:{save(tmp_path, 'DINOv3ViTModel')}")
    twin = random_twin(model)
    trained, fresh = model.hf.state_dict(), twin.hf.state_dict()
    kept = [k for k in trained if trained[k].numel() > 1 and torch.equal(trained[k], fresh[k])]
    assert kept == []  # the save() perturbation is gone everywhere: CLS, registers, projections, norms


def test_a_full_clip_folder_gives_its_vision_tower(tmp_path, capsys):
    config = transformers.CLIPConfig(vision_config={**SMALL, "image_size": 32, "patch_size": 16},
                                     text_config={**SMALL, "vocab_size": 64, "max_position_embeddings": 8},
                                     projection_dim=16)
    transformers.CLIPModel(config).save_pretrained(tmp_path / "clip")
    capsys.readouterr()
    model = load(f"hf:{tmp_path / 'clip'}")
    err = capsys.readouterr().err  # transformers' key table and progress bar: said in vitscope's one line
    assert "UNEXPECTED" not in err and "Loading weights" not in err
    tower = transformers.CLIPVisionModel.from_pretrained(tmp_path / "clip").eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(images)["prenorm"], tower(pixel_values=images)
                                   .last_hidden_state, atol=1e-6, rtol=0)
    assert model.vitscope_load["origin"] == "hf CLIPVisionModel"
    assert any(key.startswith("text_model.") for key in model.vitscope_load["dropped"])


def test_siglip2_padded_batch_of_two_aspect_ratios_padding_enters_no_metric(tmp_path):
    from vitscope.metrics import mean_attention_distance

    folder = save(tmp_path, "Siglip2VisionModel")
    model = load(f"hf:{folder}")
    torch.manual_seed(2)
    images = [torch.randn(3, 32, 48), torch.randn(3, 48, 32)]  # 2 x 3 and 3 x 2, padded to 7 tokens
    pieces = [model._inputs(image[None]) for image in images]
    batch = {"pixel_values": torch.zeros(2, 7, 16 * 16 * 3),
             "pixel_attention_mask": torch.zeros(2, 7, dtype=torch.long),
             "spatial_shapes": torch.cat([p["spatial_shapes"] for p in pieces])}
    for i, piece in enumerate(pieces):
        batch["pixel_values"][i, :6], batch["pixel_attention_mask"][i, :6] = piece["pixel_values"][0], 1
    with torch.no_grad(), vitscope.record_attention(model) as rec, vitscope.record_attention(model, keep="stats") as st:
        model.forward_features(batch)
    want = eager_outputs(folder, "Siglip2VisionModel", batch, model)
    for got, ref in zip(rec.maps, want.attentions, strict=True):  # padded maps as transformers' eager gives them
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    alone = []
    for image in images:  # each image alone, unpadded
        with torch.no_grad(), vitscope.record_attention(model) as single:
            model.forward_features(image[None])
        grid = single.layouts[0].grid_size
        alone.append(torch.stack([mean_attention_distance(p, num_prefix_tokens=0, grid_size=grid)[0]
                                  for p in single.maps]))
    torch.testing.assert_close(st.stats.mad, torch.stack(alone).mean(0), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="dict input is SigLIP2's processor output"):
        load(f"hf:{save(tmp_path, 'ViTModel')}").forward_features(batch)


@pytest.mark.parametrize("name", ["ViTModel", "DINOv3ViTModel"])
def test_the_normaliser_swap_takes_vitscopes_entmax(tmp_path, name):
    from vitscope.attention import entmax15

    folder = save(tmp_path, name)
    softmax_model, model = load(f"hf:{folder}"), load(f"hf:{folder}", attention="entmax15")
    assert model.hf.config._attn_implementation == "vitscope_normalized"
    with torch.no_grad():  # a sharper attention, so that entmax-1.5 has exact zeros
        for attn in model.attention_modules:
            attn.q_proj.weight.mul_(20)
    images = torch.randn(2, 3, 48, 48)
    queries, keys = [], []
    for attn in model.attention_modules[:1]:  # the first layer's q, k before any rotation: ViT has none
        attn.q_proj.register_forward_hook(lambda _m, _a, out: queries.append(out))
        attn.k_proj.register_forward_hook(lambda _m, _a, out: keys.append(out))
    with torch.no_grad(), vitscope.record_attention(model) as rec:
        model.forward_features(images)
    assert (rec.maps[0] == 0).any() and torch.allclose(rec.maps[0].sum(-1), torch.ones(()), atol=1e-5)
    if name == "ViTModel":
        q, k = (t.view(2, -1, 2, 16).transpose(1, 2) for t in (queries[0], keys[0]))
        torch.testing.assert_close(rec.maps[0], entmax15(q @ k.transpose(-2, -1) * 16 ** -0.5), atol=1e-5, rtol=0)
    assert softmax_model.hf.config._attn_implementation == "vitscope_sdpa"  # the other load keeps its softmax


def test_a_folders_image_processor_sets_the_view(tmp_path):
    """A DINOv2 folder's preprocessor_config.json (shortest edge 56, centre crop 48, bicubic: DINOv2's 256 / 224
    scaled down) gives the loaded model that view: vitscope feeds a photo as transformers' own image processor does
    (PIL's bicubic against torchvision's, so to resampling rounding; a bilinear or uncropped view is much further)."""
    from PIL import Image

    from vitscope.analyze.inputs import model_batches, model_view_options
    from vitscope.data import load_dataset

    folder = save(tmp_path, "Dinov2Model")
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 56},
        "resample": 3, "do_center_crop": True, "crop_size": {"height": 48, "width": 48}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225], "do_convert_rgb": True}))
    model = load(f"hf:{folder}")
    assert model.pretrained_cfg["interpolation"] == "bicubic"
    assert model.pretrained_cfg["crop_pct"] == pytest.approx(48 / 56)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = torch.Generator().manual_seed(0)
    for i, (h, w) in enumerate([(90, 146), (130, 70)]):  # long sides 90 and 104 at 56: even margins to crop
        # (torchvision, as timm, rounds a half-pixel crop offset up and transformers down: sizes that need none)
        small = (torch.rand(3, 5, 6, generator=rng) * 255).byte().permute(1, 2, 0).numpy()
        Image.fromarray(small).resize((w, h), Image.BILINEAR).save(photos / f"{i}.png")
    data = load_dataset("imagefolder", photos, "eval", **model_view_options(model, "imagefolder"))
    fed, _ = next(model_batches(model, data, 2, "cpu"))
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    theirs = processor([Image.open(photos / f"{i}.png") for i in range(2)], return_tensors="pt")["pixel_values"]
    assert fed.shape == theirs.shape == (2, 3, 48, 48)
    assert (fed - theirs).abs().mean() < 0.03  # about 2/255 of a pixel after normalisation
    plain = load_dataset("imagefolder", photos, "eval", mixed_size=48)  # bilinear, whole shorter side: not it
    other, _ = next(model_batches(model, plain, 2, "cpu"))
    assert (other - theirs).abs().mean() > 3 * (fed - theirs).abs().mean()


PROCESSORS = {  # model class: its image processor class (transformers' defaults: the hub folders' settings)
    "ViTModel": "ViTImageProcessor",  # {height, width} 224, bilinear: stretched
    "SiglipVisionModel": "SiglipImageProcessor",  # {height, width} 224, bicubic: stretched
    "DeiTModel": "DeiTImageProcessor",  # {height, width} 256 then the centre 224, bicubic
    "Dinov2Model": "BitImageProcessor",  # shortest edge 224... set to DINOv2's 256, centre crop 224, bicubic
    "CLIPVisionModel": "CLIPImageProcessor",  # shortest edge 224, centre crop 224, bicubic
}
ODD_PHOTOS = [(333, 257), (257, 333), (224, 224), (301, 300)]  # (height, width): 333 x 257 is the issue's


def write_odd_photos(folder):
    """Smooth random photos of ODD_PHOTOS' sizes (a crop excess of 107 rows at 333 x 257 on DINOv2's view)."""
    from PIL import Image

    folder.mkdir(parents=True)
    rng = torch.Generator().manual_seed(1)
    for i, (h, w) in enumerate(ODD_PHOTOS):
        small = (torch.rand(3, 9, 7, generator=rng) * 255).byte().permute(1, 2, 0).numpy()
        Image.fromarray(small).resize((w, h), Image.BICUBIC).save(folder / f"{i}.png")
    return [Image.open(folder / f"{i}.png").convert("RGB") for i in range(len(ODD_PHOTOS))]


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_hf_views_equal_the_folders_own_image_processor_on_odd_sizes(tmp_path, name):
    """vitscope feeds an hf: model what transformers' AutoImageProcessor makes of the folder's
    preprocessor_config.json, on photos of odd sizes, through load_dataset(view=model) and through the commands'
    path (mixed sizes viewed at load, model_batches); measured in uint8 levels of the unnormalised view."""
    from vitscope.analyze.inputs import model_batches, model_view_options
    from vitscope.data import eval_batches, load_dataset

    cls = getattr(transformers, name)
    torch.manual_seed(0)
    sizes = {"image_size": 518, "patch_size": 14} if name == "Dinov2Model" else {"image_size": 224, "patch_size": 16}
    cls(cls.config_class(**SMALL, **sizes)).save_pretrained(tmp_path / "model")
    processor = getattr(transformers, PROCESSORS[name])()
    if name == "Dinov2Model":  # facebook/dinov2-*: a 518 px config, a processor that feeds it 224 px
        processor = transformers.BitImageProcessor(size={"shortest_edge": 256}, image_mean=[0.485, 0.456, 0.406],
                                                   image_std=[0.229, 0.224, 0.225])
    processor.save_pretrained(tmp_path / "model")
    model = load(f"hf:{tmp_path / 'model'}")
    assert model.pretrained_cfg["input_size"] == (3, 224, 224)  # the side the processor gives, not the config's
    photos = write_odd_photos(tmp_path / "photos")
    reference = transformers.AutoImageProcessor.from_pretrained(tmp_path / "model")
    theirs = reference(photos, return_tensors="pt")["pixel_values"]
    levels = torch.tensor(reference.image_std)[:, None, None] * 255  # one unit of a normalised input, in levels
    data = load_dataset("imagefolder", tmp_path / "photos", "eval", view=model)
    ours = torch.cat([images for images, _ in eval_batches(data, 2)])
    fed = torch.cat([images for images, _ in model_batches(
        model, load_dataset("imagefolder", tmp_path / "photos", "eval", **model_view_options(model, "imagefolder")),
        2, "cpu")])
    assert ours.shape == fed.shape == theirs.shape == (len(ODD_PHOTOS), 3, 224, 224)
    for got in (ours, fed):
        diff = ((got - theirs) * levels).abs()
        assert diff.mean() < 0.05 and diff.max() <= 1.01, (name, float(diff.mean()), float(diff.max()))


def test_the_load_line_says_which_view_and_what_it_could_not_reproduce(tmp_path, capsys):
    """DINOv2's processor is named in the load line as it is applied; SigLIP2's aspect-keeping patch budget has no
    square view, which the line says (the model then gets the view of a model that names none)."""
    folder = save(tmp_path, "Dinov2Model")
    transformers.BitImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 48, "width": 48}).save_pretrained(
        folder)
    model = load(f"hf:{folder}")
    assert "view as its image processor: shortest edge to 56, bicubic, centre 48 x 48 cut" in capsys.readouterr().err
    assert model.pretrained_cfg["crop_mode"] == "center" and model.pretrained_cfg["resize_size"] == 56
    folder = save(tmp_path, "Siglip2VisionModel")
    transformers.Siglip2ImageProcessor(max_num_patches=9).save_pretrained(folder)
    model = load(f"hf:{folder}")
    err = capsys.readouterr().err
    assert "its image processor's view is not reproduced (each image resized to at most 9 patches" in err
    assert "crop_pct" not in model.pretrained_cfg and model.pretrained_cfg["mean"] == (0.5, 0.5, 0.5)
