"""Options are applied or refused, never ignored: input size, registers, layer numbers, --out, the shared options
before or after the command, train's data flags, demo selection and index, doctor."""

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitscope.cli import build_parser, main
from vitscope.cli.analyze import detect_layer_index
from vitscope.cli.options import resolve_shared
from vitscope.cli.preflight import quiet_torch_notices
from vitscope.models import create, load, save_model

ROOT = Path(__file__).resolve().parents[1]


def test_img_size_builds_a_preset_at_that_size():
    model = load("vit-micro", img_size=48).eval()
    assert model.grid_size == (12, 12) and model(torch.randn(1, 3, 48, 48)).shape == (1, 10)


def test_img_size_resamples_loaded_weights_as_timm_does(tmp_path):
    torch.manual_seed(0)
    trained = create("vit-micro").eval()
    path = save_model(trained, tmp_path / "m.safetensors")
    for resized in (load(str(path), img_size=48), load("vit-micro", weights=path, img_size=48)):
        pos, old = resized.pos_embed.detach(), trained.pos_embed.detach()
        assert torch.equal(pos[:, :1], old[:, :1])  # CLS entry kept
        grid = old[:, 1:].reshape(1, 8, 8, -1).permute(0, 3, 1, 2)
        want = F.interpolate(grid, size=(12, 12), mode="bicubic", align_corners=False, antialias=True)  # timm's
        assert torch.allclose(pos[:, 1:], want.permute(0, 2, 3, 1).reshape(1, 144, -1), atol=1e-6)
        assert torch.equal(resized.blocks[1].attn.qkv.weight, trained.blocks[1].attn.qkv.weight)
    same = load(str(path), img_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(same(x), trained(x))


@pytest.mark.parametrize("spec", ["vit-micro", "timm:vit_small_patch16_224"])
def test_img_size_off_the_patch_grid_is_refused(spec):
    options = {"depth": 1} if spec.startswith("timm:") else {}
    with pytest.raises(ValueError, match=r"img_size=33 is not a multiple of .*patch size (4|16)"):
        load(spec, img_size=33, **options)


def test_timm_img_size_is_applied():
    model = load("timm:vit_small_patch16_224", img_size=64, depth=1)
    assert tuple(model.patch_embed.grid_size) == (4, 4)


@pytest.mark.parametrize("spec", ["vit-micro", "timm:vit_small_patch16_224"])
def test_negative_register_count_is_refused(spec):
    with pytest.raises(ValueError, match="num_registers=-1 must be an integer >= 0"):
        load(spec, num_registers=-1, **({"depth": 1} if spec.startswith("timm:") else {}))


def test_cli_refuses_bad_img_size_in_one_line(tmp_path, capsys):
    code = main(["analyze", "locality", "--model", "vit-micro", "--img-size", "33", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "img_size=33 is not a multiple" in err


def test_detect_layer_follows_token_layer_numbering(tmp_path):
    assert detect_layer_index("last") == -1 and detect_layer_index("1") == 0 and detect_layer_index("4") == 3
    for bad, message in (("0", "layer 0 is the embedding"), ("x", "1..L or 'last'")):
        with pytest.raises(ValueError, match=message):
            detect_layer_index(bad)
    common = ["analyze", "norms", "--model", "vit-micro", "--num-images", "8", "--batch-size", "8", "--device", "cpu"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--detect-layer", "2", "--out", str(tmp_path / "b")]) == 0
    assert main([*common, "--detect-layer", "5", "--out", str(tmp_path / "c")]) == 2  # vit-micro has 4 blocks
    layer = {k: json.loads((tmp_path / k / "norms.json").read_text())["threshold"]["detection_layer"] for k in "ab"}
    assert layer == {"a": 4, "b": 2}
    sample = json.loads((tmp_path / "a" / "norms.json").read_text())["provenance"]["subsets"]["eval"]
    assert (sample["method"], sample["count"], sample["seed"]) == ("class-stratified", 8, 0)  # --num-images


def test_out_that_is_a_file_or_cannot_be_made_is_named(tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    assert main(["analyze", "locality", "--out", str(blocker)]) == 2
    assert f"--out {blocker} is an existing file" in capsys.readouterr().err
    assert main(["--out", str(blocker / "sub"), "demo"]) == 2
    assert f"--out {blocker / 'sub'} cannot be created" in capsys.readouterr().err


def shared(argv):
    args = build_parser().parse_args(argv)
    resolve_shared(args, args.command)
    return args


def test_shared_options_before_or_after_the_command():
    before = shared(["--device", "cpu", "--seed", "3", "--batch-size", "16", "--out", "x", "--debug", "analyze",
                     "locality"])
    after = shared(["analyze", "locality", "--device", "cpu", "--seed", "3", "--batch-size", "16", "--out", "x",
                    "--debug"])
    keys = ("device", "seed", "batch_size", "out", "debug")
    assert [getattr(before, k) for k in keys] == [getattr(after, k) for k in keys] == ["cpu", 3, 16, "x", True]
    assert shared(["--seed", "1", "demo", "--seed", "2"]).seed == 2  # after the command wins
    defaults = shared(["demo"])
    assert (defaults.device, defaults.seed, defaults.out, defaults.debug) == ("auto", 0, "vitscope-demo", False)
    assert shared(["models", "--debug"]).debug
    with pytest.raises(ValueError, match="--out does not apply to `vitscope models`"):
        shared(["--out", "x", "models"])
    for command in (["train"], ["study", "locality"], ["demo"], ["analyze", "norms"], ["doctor"]):
        assert build_parser().parse_args([*command, "--device", "cpu", "--debug"]).device == "cpu"


def test_study_seed_is_one_seeds():
    from vitscope.cli.options import parse_seeds

    assert parse_seeds(None, None) == [0] and parse_seeds(None, 4) == [4] and parse_seeds("1,2", None) == [1, 2]
    with pytest.raises(ValueError, match="use one"):
        parse_seeds("1", 2)


def test_train_takes_data_flags_and_records_the_subset(tmp_path, capsys):
    code = main(["train", "--config", str(ROOT / "configs" / "compact-cifar100.yaml"),
                 "--data-dir", str(tmp_path / "no-such-folder"), "--out", str(tmp_path / "c100")])
    assert code == 2 and f"data directory {tmp_path / 'no-such-folder'} does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    code = main(["train", "--dataset", "synthetic", "--device", "cpu", "--batch-size", "32", "--seed", "5",
                 "--out", str(run), "--set", "model=vit-micro", "--set", "model_options.depth=1",
                 "--set", "dataset_options.num_images=128", "train_images=96", "eval_images=64",  # several after one
                 "--set", "epochs=1", "progress=true"])
    printed = capsys.readouterr()
    assert code == 0 and "after 1 epoch;" in printed.out
    assert "read in memory" not in printed.err  # built-in scenes: no data-source notice to read
    meta = json.loads((run / "config.json").read_text())
    assert (meta["config"]["dataset"], meta["config"]["batch_size"], meta["config"]["seed"]) == ("synthetic", 32, 5)
    assert meta["subsets"]["train"]["count"] == 96 and meta["subsets"]["train"]["method"] == "class-stratified"
    assert meta["subsets"]["eval"]["count"] == 64


def test_timm_user_warnings_are_kept_out_and_others_kept():
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_torch_notices()
        warnings.warn_explicit("non-contiguous", UserWarning, "interpolate.py", 47, module="timm.layers.interpolate")
        warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="vitscope.models")
    assert [str(w.message) for w in seen] == ["ours"]


def test_cuda_runtime_notice_is_kept_out(caplog):
    quiet_torch_notices()
    logger = logging.getLogger("torch.utils.cpp_extension")
    with caplog.at_level(logging.WARNING):
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local/cuda")
        from torch.utils.cpp_extension import _find_cuda_home

        _find_cuda_home()  # torch's own call: logs the notice where a toolkit is installed without a GPU
        logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_demo_runs_the_named_demos_and_writes_an_index(tmp_path, monkeypatch, capsys):
    import vitscope.cli.demo as demo

    ran = []

    def fake(out, device, seed, batch_size):
        ran.append((out.name, device, seed, batch_size))
        out.mkdir(parents=True, exist_ok=True)
        return (out / "report.html").write_text("<html></html>") and out / "report.html"

    monkeypatch.setitem(globals(), "fake_demo", fake)
    monkeypatch.setattr(demo, "DEMOS", {"one": demo.Demo("Study one", f"{__name__}:fake_demo", 1.0),
                                        "two": demo.Demo("Study two", f"{__name__}:fake_demo", 1.0)})
    assert main(["demo", "two", "--out", str(tmp_path), "--device", "cpu", "--batch-size", "8"]) == 0
    assert ran == [("two", "cpu", 0, 8)]
    index = (tmp_path / "index.html").read_text()
    assert 'href="two/report.html"' in index and "vitscope demo one" in index  # one not run yet
    assert main(["demo", "--out", str(tmp_path)]) == 0 and [r[0] for r in ran[1:]] == ["one", "two"]
    assert 'href="one/report.html"' in (tmp_path / "index.html").read_text()
    assert main(["demo", "three", "--out", str(tmp_path)]) == 2
    assert "no demo named three; choose from one, two" in capsys.readouterr().err


def test_doctor_reports_and_fails_when_native_kernels_do_not_load(tmp_path, monkeypatch, capsys):
    from vitscope.attention import fast_paths, native
    from vitscope.cli.doctor import compiler

    assert main(["doctor", "--device", "cpu"]) in (0, 1)
    out = capsys.readouterr().out
    assert all(f"{section}:" in out for section in ("versions", "device", "compiler", "normalisers", "caches"))
    if compiler()["path"] is None:
        pytest.skip("no C++ compiler: the native kernels cannot be built here")
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VITSCOPE_NATIVE", "1")
    monkeypatch.setenv("VITSCOPE_FUSED", "1")
    missing = native.NativeKernels(sources=(*native.SOURCES, tmp_path / "missing.h"))  # a wheel without a file
    with fast_paths(kernels=missing):
        assert main(["doctor", "--device", "cpu"]) == 1
    assert "problem: native CPU kernels failed to load although a C++ compiler is present" in capsys.readouterr().out


def test_demo_index_links_each_report_as_soon_as_its_demo_finishes(tmp_path, monkeypatch):
    """The index appeared only at the very end; when the second demo starts, the first one's report is linked."""
    import vitscope.cli.demo as demo

    seen = []

    def fake(out, device, seed, batch_size):
        seen.append((out.name, (out.parent / "index.html").read_text()))  # the index as this demo starts
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.html").write_text("<html></html>")
        return out / "report.html"

    monkeypatch.setitem(globals(), "fake_demo", fake)
    monkeypatch.setattr(demo, "DEMOS", {"one": demo.Demo("Study one", f"{__name__}:fake_demo", 1.0),
                                        "two": demo.Demo("Study two", f"{__name__}:fake_demo", 1.0)})
    monkeypatch.setattr("vitscope.explorer.demo.explorer_demo", lambda out, device: None)
    assert main(["demo", "--out", str(tmp_path), "--device", "cpu"]) == 0
    assert [name for name, _ in seen] == ["one", "two"]
    assert 'href="one/report.html"' not in seen[0][1] and 'href="one/report.html"' in seen[1][1]


def test_a_missing_data_folder_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """It was reported only after the model loaded (25 s for a pretrained one)."""
    import vitscope.models
    from cli_refusals import refused

    def loads(*args, **kwargs):
        raise AssertionError("the model was loaded before the data folder was checked")

    monkeypatch.setattr(vitscope.models, "load", loads)
    missing = tmp_path / "cifar"
    for argv in (["analyze", "norms"], ["probe", "linear"], ["explore"]):
        line = refused([*argv, "--dataset", "cifar10", "--data-dir", str(missing), "--out", str(tmp_path / "out")],
                       capsys)
        assert f"data directory {missing} does not exist; pass --data-dir with the cifar10 folder or archive" in line
    run = tmp_path / "run"  # a run folder's own data folder, read from its config
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": {"dataset": "cifar10", "data_dir": str(missing)}}))
    line = refused(["analyze", "norms", "--model", str(run), "--out", str(tmp_path / "out")], capsys)
    assert f"data directory {missing} does not exist" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, typo, meant", [
    ("analyze norms", ["--num-imgs", "4"], "--num-images"),
    ("analyze norms", ["--img_size", "224"], "--img-size"),
    ("probe linear", ["--trian-images=8"], "--train-images"),
    ("train", ["--data_dir", "x"], "--data-dir"),
    ("explore", ["--compre", "a=vit-micro"], "--compare"),
])
def test_a_flag_typo_gets_did_you_mean(command, typo, meant, capsys):
    from cli_refusals import refused

    line = refused([*command.split(), *typo], capsys)
    assert line == (f"vitscope: error: unrecognized arguments: {' '.join(typo)}; did you mean {meant}?; see "
                    f"`vitscope {command} --help`")


def test_an_unknown_flag_far_from_every_option_gets_no_guess(capsys):
    from cli_refusals import refused

    assert "did you mean" not in refused(["analyze", "norms", "--zzz"], capsys)


def test_download_asked_for_a_models_weights_does_not_refuse_built_in_data():
    """``--download`` also fetches model weights; with the built-in scenes (nothing to fetch) it is no refusal."""
    from vitscope.data import load_dataset

    assert len(load_dataset("synthetic", None, "eval", download=True, num_images=4)) == 4
    with pytest.raises(ValueError, match="--download fetches cifar10 and cifar100, not imagefolder"):
        load_dataset("imagefolder", "/nonexistent/photos", "eval", download=True)


def test_download_with_local_data_reads_the_local_data(tmp_path):
    """``--download`` meant for a model's weights, with an image folder that is there: the folder is read, nothing
    is fetched for it (it was refused: "supports cifar10 and cifar100, not imagefolder")."""
    import numpy as np
    from PIL import Image

    from vitscope.data import load_dataset

    (tmp_path / "photos" / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "photos" / "a" / "0.png")
    assert len(load_dataset("imagefolder", tmp_path / "photos", "eval", download=True)) == 1
