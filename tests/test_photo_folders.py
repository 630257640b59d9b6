"""Real photo folders: mixed sizes and aspect ratios in the three imagefolder layouts, views that are timm's eval
transform (shorter side resized, centre crop, never stretched), the same pixels in memory and streamed, one-line
errors for odd layouts, and `analyze locality` / `explore` on a mixed-size folder with no size flag."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import decode_image
from torchvision.transforms import v2

from vitscope.cli import main
from vitscope.data import load_dataset, open_streamed
from vitscope.data.pixels import View, eval_view

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")  # torchvision 0.29
SIZES = [(30, 50), (48, 20), (24, 24), (37, 29)]  # (height, width): landscape, portrait, square, odd


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))


def write_photo(path: Path, seed: int, height: int, width: int) -> None:
    """A smooth random photo (JPEG or PNG by suffix) written with PIL."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    small.resize((width, height), Image.BILINEAR).save(path)


def make_layout(root: Path, layout: str) -> Path:
    """``split``: train/ and val/ with two classes; ``classes``: <class>/ only; ``flat``: images only."""
    for i, (h, w) in enumerate(SIZES):
        name = f"{i}.jpg" if i % 2 else f"{i}.png"
        cls = ("cat", "dog")[i % 2]
        if layout == "split":
            for split in ("train", "val"):
                write_photo(root / split / cls / name, 10 * i + len(split), h, w)
        elif layout == "classes":
            write_photo(root / cls / name, i, h, w)
        else:
            write_photo(root / name, i, h, w)
    return root


def test_a_view_is_torchvision_resize_and_centre_crop_of_the_file_and_timms_eval_transform(tmp_path):
    path = tmp_path / "photos" / "wide.jpg"
    write_photo(path, 3, 30, 50)
    data = load_dataset("imagefolder", path.parent, "eval", image_size=16, crop_pct=0.8)
    # torchvision's transform classes on the decoded file: shorter side floor(16 / 0.8) = 20, centre 16 x 16
    reference = v2.Compose([v2.Resize(20, antialias=True), v2.CenterCrop(16)])(decode_image(str(path)))
    assert data.classes == ["photos"] and torch.equal(data.images[0], reference)
    # timm's own eval transform (PIL resize) cuts the same part of the picture (to PIL's resampling rounding)
    import timm.data

    timm_view = timm.data.create_transform(input_size=16, crop_pct=0.8, interpolation="bilinear")(Image.open(path))
    timm_pixels = timm_view * torch.tensor([0.229, 0.224, 0.225])[:, None, None] + torch.tensor(
        [0.485, 0.456, 0.406])[:, None, None]
    assert (data.images[0].float() / 255 - timm_pixels).abs().max() < 3 / 255
    stretched = torch.nn.functional.interpolate(decode_image(str(path))[None].float(), size=(16, 16),
                                                mode="bilinear", antialias=True)[0]
    assert (data.images[0].float() - stretched).abs().max() > 20  # the whole picture squeezed is not it


@pytest.mark.parametrize("layout", ["split", "classes", "flat"])
def test_each_layout_of_mixed_sizes_gives_the_same_pixels_in_memory_and_streamed(tmp_path, layout):
    root = make_layout(tmp_path / "photos", layout)
    memory = load_dataset("imagefolder", root, "eval", mixed_size=16)
    streamed = open_streamed("imagefolder", root, "eval", image_size=16)
    assert memory.images.shape == (4, 3, 16, 16)
    assert torch.equal(memory.images, streamed.images_at(torch.arange(4)))
    assert memory.labels.tolist() == streamed.labels.tolist() and memory.classes == streamed.classes
    expected = {"split": ["cat", "dog"], "classes": ["cat", "dog"], "flat": ["photos"]}[layout]
    assert memory.classes == expected
    files = sorted(f for f in root.rglob("*") if f.is_file() and (layout != "split" or "val" in f.parts))
    for image, label, file in zip(memory.images, memory.labels.tolist(), files, strict=True):
        assert torch.equal(image, eval_view(decode_image(str(file)), 16))  # each file's own view, in file order
        assert memory.classes[label] == (file.parent.name if layout != "flat" else "photos")
    again = load_dataset("imagefolder", root, "eval", mixed_size=16)  # from the decode cache
    assert torch.equal(again.images, memory.images)


def test_a_folder_of_one_size_keeps_its_pixels_whatever_size_the_model_needs(tmp_path):
    root = tmp_path / "same"
    for i in range(3):
        write_photo(root / "train" / "a" / f"{i}.png", i, 12, 12)
        write_photo(root / "val" / "a" / f"{i}.png", i, 12, 12)
    native = load_dataset("imagefolder", root, "eval", mixed_size=16)
    assert native.images.shape == (3, 3, 12, 12)
    assert torch.equal(native.images[1], decode_image(str(root / "val" / "a" / "1.png")))
    # one decoded copy for every model size: the same cache entry as a load that names no size (CIFAR's stays valid)
    assert load_dataset("imagefolder", root, "eval", mixed_size=24).images.shape == (3, 3, 12, 12)
    assert torch.equal(load_dataset("imagefolder", root, "eval").images, native.images)
    assert len(list((tmp_path / "cache" / "datasets").glob("imagefolder-eval-*"))) == 1
    assert load_dataset("imagefolder", root, "eval", image_size=16).images.shape == (3, 3, 16, 16)


def test_odd_and_empty_layouts_say_what_was_found_in_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "sub" / "readme.md").write_text("no images")
    (notes / "list.txt").write_text("no images")
    mixed = make_layout(tmp_path / "mixed", "classes")
    write_photo(mixed / "loose.jpg", 9, 20, 20)
    outside = make_layout(tmp_path / "outside", "split")
    write_photo(outside / "stray" / "x.jpg", 9, 20, 20)
    cases = [(empty, "eval", r"no images in .*empty \(it is empty\)"),
             (notes, "eval", r"no images in .*notes \(found list\.txt, sub/readme\.md\)"),
             (mixed, "eval", r"holds 1 images directly \(loose\.jpg\) and 4 in class folders"),
             (outside, "eval", r"mixes split folders \(train/, val/\) with 1 images outside them \(stray/x\.jpg\)"),
             (make_layout(tmp_path / "classes", "classes"), "train", r"no train/ and val/ \(or test/\) split")]
    for root, split, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as err:
            load_dataset("imagefolder", root, split)
        message = str(err.value)
        assert "\n" not in message
        assert "imagefolder reads" in message or "held-out split" in message
        with pytest.raises(ValueError, match=pattern):  # the streamed listing says the same
            open_streamed("imagefolder", root, split)


def test_analyze_locality_and_explore_read_a_mixed_size_folder_with_no_size_flag(tmp_path, capsys):
    root = make_layout(tmp_path / "photos", "classes")
    common = ["--model", "vit-micro", "--dataset", "imagefolder", "--data-dir", str(root), "--device", "cpu"]
    assert main(["analyze", "locality", *common, "--out", str(tmp_path / "loc")]) == 0
    result = json.loads((tmp_path / "loc" / "locality.json").read_text())
    assert result["summary"]["num_images"] == 4 and math.isfinite(result["summary"]["min_early_mad"])
    assert main(["explore", *common, "--out", str(tmp_path / "exp")]) == 0
    assert "4 images" in capsys.readouterr().out and (tmp_path / "exp" / "explorer.html").is_file()
    # the same options as analyze: --set dataset_options.image_size views every image at that side first
    assert main(["explore", *common, "--set", "dataset_options.image_size=24", "--img-size", "16",
                 "--out", str(tmp_path / "exp16")]) == 0
    assert main(["probe", "linear", *common, "--out", str(tmp_path / "probe")]) == 2  # no held-out split
    assert "held-out split" in capsys.readouterr().err and not (tmp_path / "probe").exists()


def test_a_pretrained_models_interpolation_is_used_for_its_view_in_memory_streamed_and_fed(tmp_path):
    """A timm model whose pretrained config names bicubic (as most ViTs do) gets bicubic views, as timm's eval
    transform makes them: in memory, streamed and in ``model_batches``; a model that names none stays bilinear."""
    import timm.data

    from vitscope.analyze.inputs import model_batches, model_interpolation, model_view_options
    from vitscope.data import normalize
    from vitscope.models import load

    model = load("timm:vit_tiny_patch16_224", img_size=32)
    assert model.pretrained_cfg["interpolation"] == "bicubic" and model_interpolation(model) == "bicubic"
    assert model_interpolation(load("vit-micro")) == "bilinear"  # vitscope's own models name none
    root = make_layout(tmp_path / "photos", "classes")
    options = model_view_options(model, "imagefolder", 32)
    crop_pct = model.pretrained_cfg["crop_pct"]
    assert options == {"mixed_size": View(32, crop_pct, "bicubic", keep_square=False)}  # timm's view, every image
    memory = load_dataset("imagefolder", root, "eval", **options)
    streamed = open_streamed("imagefolder", root, "eval", image_size=32, crop_pct=crop_pct, interpolation="bicubic")
    assert torch.equal(memory.images, streamed.images_at(torch.arange(4)))  # no photo is 32 x 32: the same view
    files = sorted(f for f in root.rglob("*") if f.is_file())
    short = math.floor(32 / crop_pct)
    bicubic = v2.Compose([v2.Resize(short, interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
                          v2.CenterCrop(32)])
    for image, file in zip(memory.images, files, strict=True):
        assert torch.equal(image, bicubic(decode_image(str(file))))
    bilinear = load_dataset("imagefolder", root, "eval", mixed_size=32, crop_pct=crop_pct)
    assert (bilinear.images.float() - memory.images.float()).abs().max() > 2  # another resampling, another key
    # timm's own eval transform for this model (PIL bicubic) gives the same view, to PIL's rounding
    config = timm.data.resolve_data_config({"input_size": (3, 32, 32)}, model=model)  # the model's, at 32 px
    assert config["interpolation"] == "bicubic"
    timm_view = timm.data.create_transform(**config)(Image.open(files[0]))
    mean, std = (torch.tensor(model.pretrained_cfg[k])[:, None, None] for k in ("mean", "std"))
    assert (memory.images[0].float() / 255 - (timm_view * std + mean)).abs().mean() < 2 / 255
    # a CIFAR-sized set (one size) keeps its pixels and is viewed at the model's side when fed, bicubic too
    square = load_dataset("imagefolder", root, "eval", mixed_size=24, crop_pct=1.0)  # 24 x 24 views
    fed, _ = next(model_batches(model, square, 4, "cpu"))
    want = resize_center(square.images, short, 32)
    torch.testing.assert_close(fed, normalize(want, model.pretrained_cfg["mean"], model.pretrained_cfg["std"]))


def resize_center(images: torch.Tensor, short: int, size: int) -> torch.Tensor:
    """torchvision's bicubic antialiased resize of the shorter side to ``short``, then the centre ``size`` crop."""
    return v2.functional.center_crop(v2.functional.resize(images, [short], interpolation=v2.InterpolationMode.BICUBIC,
                                                           antialias=True), [size, size])


TINY_TIMM = {"depth": 1, "embed_dim": 32, "num_heads": 2, "img_size": 64}


@pytest.mark.parametrize("spec, pretrained", [("timm:vit_small_patch16_224", None),  # centre, crop 0.9, bicubic
                                              ("timm:vit_base_patch32_clip_384.openai_ft_in12k_in1k", False)])  # squash
def test_timm_models_follow_timms_eval_transform_on_photos_already_at_their_side(tmp_path, spec, pretrained):
    """Photos already S x S (and mixed ones) reach a pretrained timm model as timm's own eval transform
    (``create_transform(**resolve_data_config(model=model))``) makes them, crop_pct and crop_mode included: through
    the commands' path (model_view_options, model_batches) and through load_dataset(view=model). Only a model that
    names no crop (vitscope's own) keeps an S x S photo's pixels."""
    import timm.data

    from vitscope.analyze.inputs import model_batches, model_view_options
    from vitscope.data import eval_batches
    from vitscope.models import load

    model = load(spec, pretrained=pretrained, **TINY_TIMM)
    config = timm.data.resolve_data_config({"input_size": (3, 64, 64)}, model=model)  # the model's, at its 64 px
    assert config["crop_pct"] < 1
    transform = timm.data.create_transform(**config)
    levels = torch.tensor(config["std"])[:, None, None] * 255
    square, mixed = tmp_path / "square", make_layout(tmp_path / "mixed", "flat")
    for i in range(3):
        write_photo(square / f"{i}.png", 20 + i, 64, 64)
    for root in (square, mixed):
        files = sorted(f for f in root.rglob("*") if f.is_file())
        theirs = torch.stack([transform(Image.open(f).convert("RGB")) for f in files])
        commands = load_dataset("imagefolder", root, "eval", **model_view_options(model, "imagefolder"))
        viewed = load_dataset("imagefolder", root, "eval", view=model)
        for got in (next(model_batches(model, commands, 8, "cpu"))[0], next(eval_batches(viewed, 8))[0]):
            diff = ((got - theirs) * levels).abs()
            assert diff.mean() < 0.05 and diff.max() <= 2.01, (root.name, float(diff.mean()))
    own = load("vit-micro")  # 32 px, no crop named: a 32 x 32 photo is fed as it is
    for i in range(2):
        write_photo(tmp_path / "own" / f"{i}.png", i, 32, 32)
    data = load_dataset("imagefolder", tmp_path / "own", "eval", **model_view_options(own, "imagefolder"))
    fed, _ = next(model_batches(own, data, 2, "cpu"))
    raw = torch.stack([decode_image(str(tmp_path / "own" / f"{i}.png")) for i in range(2)])
    torch.testing.assert_close(fed, normalize_like(raw, data))


def normalize_like(images: torch.Tensor, data) -> torch.Tensor:
    from vitscope.data import normalize

    return normalize(images, data.mean, data.std)


def test_the_python_api_and_analyze_see_the_same_photos_and_measure_the_same_mad(tmp_path):
    """load_dataset(..., view=model) gives the pixels `vitscope analyze` feeds the model (its side, resize, crop
    and bicubic interpolation), so the Python API's MAD of each head equals the command's on the same photos; the
    API's old way (image_size=S: bilinear, the whole shorter side) measured another number."""
    import transformers

    import vitscope
    from vitscope.data import eval_batches
    from vitscope.models import load

    torch.manual_seed(0)
    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                                       image_size=518, patch_size=14)
    dinov2 = transformers.Dinov2Model(config)
    with torch.no_grad():  # sharp, content-driven attention: the pixels a head sees move its MAD
        for name, param in dinov2.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "patch_embeddings.projection.weight")):
                param.mul_(6)
    dinov2.save_pretrained(tmp_path / "dinov2")
    transformers.BitImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}).save_pretrained(
        tmp_path / "dinov2")  # DINOv2's 256 / 224 at a quarter: bicubic, shortest edge, centre crop
    root = make_layout(tmp_path / "photos", "classes")
    assert main(["analyze", "locality", "--model", f"hf:{tmp_path / 'dinov2'}", "--dataset", "imagefolder",
                 "--data-dir", str(root), "--device", "cpu", "--out", str(tmp_path / "loc")]) == 0
    heads = json.loads((tmp_path / "loc" / "locality.json").read_text())["heads"]
    cli = torch.tensor([[row["mad"] for row in heads if row["layer"] == layer] for layer in (1, 2)])

    def python_mad(**options):
        model = load(f"hf:{tmp_path / 'dinov2'}").eval()
        photos = load_dataset("imagefolder", root, "eval", **options)
        with torch.no_grad(), vitscope.record_attention(model, keep="stats") as rec:
            for images, _ in eval_batches(photos, 128):
                model(images)
        return rec.stats.mad

    model = load(f"hf:{tmp_path / 'dinov2'}")
    torch.testing.assert_close(python_mad(view=model), cli, atol=1e-6, rtol=0)
    assert (python_mad(image_size=56) - cli).abs().max() > 1e-3
