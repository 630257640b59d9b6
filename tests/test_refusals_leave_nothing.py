"""What a fuzz of bad inputs met: every refused command prints one line naming the value and the fix, exits 2, and
leaves no ``--out`` folder behind (README: a refused command leaves none), whichever command refused it and however
deep the refusal came (argument types, model specs, data files, a study refused after it took its folder's lock)."""

import errno
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_refusals import refused as _refused


def refused(argv: list[str], capsys) -> str:
    """The error line; training notices may come before it."""
    return _refused(argv, capsys, only_line=False)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py




# ---- bad data folders, written by each case ----

def _image(path: Path, h: int = 8, w: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), 100, np.uint8)).save(path)


def _segfolder(root: Path, classes: str = '{"classes": ["a", "b"], "ignore_index": 255}', mask: bytes | None = None,
               val: bool = True) -> Path:
    (root / "classes.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "classes.json").write_text(classes)
    for split in ("train", "val") if val else ("train",):
        _image(root / "images" / split / "one.png")
        (root / "masks" / split).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "masks" / split / "one.png")
    if not val:
        (root / "images" / "val").mkdir(parents=True)
        (root / "masks" / "val").mkdir(parents=True)
    if mask is not None:
        (root / "masks" / "train" / "one.png").write_bytes(mask)
    return root


def _depthfolder(root: Path, scale: str | None = None, npy: bytes | None = None) -> Path:
    for split in ("train", "val"):
        _image(root / "images" / split / "one.png")
        (root / "depth" / split).mkdir(parents=True, exist_ok=True)
        np.save(root / "depth" / split / "one.npy", np.full((8, 8), 2.0, np.float32))
    if scale is not None:
        (root / "depth.json").write_text(scale)
    if npy is not None:
        (root / "depth" / "train" / "one.npy").write_bytes(npy)
    return root


def _nyu(root: Path, line: str) -> Path:
    (root / "data").mkdir(parents=True)
    for split in ("train", "test"):
        (root / "data" / f"nyu2_{split}.csv").write_text(line + "\n")
    return root


def _hf(root: Path, damage: str) -> str:
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, image_size=32, patch_size=8)
    transformers.Dinov2Model(config).save_pretrained(root)
    weights = root / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:  # the config of a wider model over these weights
        saved = json.loads((root / "config.json").read_text())
        (root / "config.json").write_text(json.dumps(saved | {"hidden_size": 48, "intermediate_size": 96}))
    return f"hf:{root}"


PROBE = ["--device", "cpu", "--num-images", "4", "--batch-size", "4"]
# (id, argv builder given a scratch folder, what the line must name); --out <tmp>/out is appended to each
CASES = [
    ("linear-epochs-0", lambda d: ["probe", "linear", "--epochs", "0"], "--epochs: '0' must be an integer >= 1"),
    ("tokens-max-tokens-0", lambda d: ["probe", "tokens", "--max-tokens", "0"], "--max-tokens: '0'"),
    ("knn-k-0", lambda d: ["probe", "knn", "--k", "0"], "--k: '0'"),
    ("demo-tpu", lambda d: ["demo", "sparse", "--device", "tpu"], "device 'tpu' is unknown"),
    ("explore-compare-empty", lambda d: ["explore", "--compare", "x="], "--compare 'x=' needs the form"),
    ("hf-missing-folder", lambda d: ["analyze", "norms", "--model", f"hf:{d}/missing", *PROBE],
     "does not exist; give hf: the folder written by save_pretrained"),
    ("hf-truncated", lambda d: ["analyze", "norms", "--model", _hf(d / "hf", "truncated"), *PROBE],
     "cannot be read"),
    ("hf-other-width", lambda d: ["analyze", "norms", "--model", _hf(d / "hf", "width"), *PROBE],
     "do not fit the model its config.json describes"),
    ("open-clip-empty-file", lambda d: ["analyze", "norms", "--model", "open_clip:ViT-S-32@", *PROBE],
     "names no file after '@'"),
    ("open-clip-empty-tag", lambda d: ["analyze", "norms", "--model", "open_clip:ViT-B-32/", *PROBE],
     "open_clip:ViT-B-32/ names no tag after '/'"),  # built a random tower and exited 0
    ("open-clip-resnet", lambda d: ["analyze", "norms", "--model", "open_clip:RN50", *PROBE],
     "is not a Vision Transformer"),
    ("pos-interp-random-timm", lambda d: ["analyze", "norms", "--model", "timm:vit_tiny_patch16_224",
                                          "--pos-interp", "original", *PROBE], "pos_interp='original'"),
    ("pos-interp-hf", lambda d: ["analyze", "norms", "--model", "hf:Dinov2Model", "--pos-interp", "original",
                                 *PROBE], "drop it, or give timm:NAME with --weights FILE"),
    ("segfolder-bad-json", lambda d: ["probe", "segment", "--dataset", "segfolder", "--data-dir",
                                      str(_segfolder(d / "s", classes="{classes: [")), *PROBE],
     "classes.json is not valid JSON"),
    ("segfolder-keyless", lambda d: ["probe", "segment", "--dataset", "segfolder", "--data-dir",
                                     str(_segfolder(d / "s", classes='{"names": ["a"]}')), *PROBE],
     '"classes" must be a non-empty list'),
    ("segfolder-corrupt-mask", lambda d: ["probe", "segment", "--dataset", "segfolder", "--data-dir",
                                          str(_segfolder(d / "s", mask=b"not a png")), *PROBE],
     "one.png cannot be read as a mask image"),
    ("segfolder-empty-val", lambda d: ["probe", "segment", "--dataset", "segfolder", "--data-dir",
                                       str(_segfolder(d / "s", val=False)), *PROBE], "no images in"),
    ("depth-corrupt-npy", lambda d: ["probe", "depth", "--dataset", "depthfolder", "--data-dir",
                                     str(_depthfolder(d / "dp", npy=b"\x93NUMPY garbage")), *PROBE],
     "one.npy cannot be read as a .npy depth map"),
    ("depth-scale-mm", lambda d: ["probe", "depth", "--dataset", "depthfolder", "--data-dir",
                                  str(_depthfolder(d / "dp", scale='{"scale": "mm"}')), *PROBE],
     "\"scale\" must be a number of metres per stored unit > 0 (got 'mm')"),
    ("nyu-one-column", lambda d: ["probe", "depth", "--dataset", "nyu", "--data-dir", str(_nyu(d / "n", "a.jpg")),
                                  *PROBE], "line 1: 'a.jpg' is not 'rgb_path,depth_path'"),
    ("nyu-semicolons", lambda d: ["probe", "depth", "--dataset", "nyu", "--data-dir",
                                  str(_nyu(d / "n", "a.jpg;a.png")), *PROBE], "it uses ';'"),
    ("analyze-unknown-model", lambda d: ["analyze", "locality", "--model", "nope", *PROBE], "unknown model spec"),
    ("probe-missing-data", lambda d: ["probe", "linear", "--dataset", "cifar10", "--data-dir", str(d / "none"),
                                      *PROBE], str(Path("none"))),
    ("export-unknown-model", lambda d: ["export", "--model", "nope"], "unknown model spec"),
    # refused after the study took its folder (and its lock): the folder it made goes again
    ("study-registers-bad-model", lambda d: ["study", "registers", "--preset", "none", "--registers", "",
                                             "--model", "a=nope", "--device", "cpu"], "unknown model spec 'nope'"),
    ("study-sparse-bad-model", lambda d: ["study", "sparse", "--conditions", "", "--model", "a=nope",
                                          "--device", "cpu"], "unknown model spec 'nope'"),
    ("study-sparse-img-size-without-model", lambda d: ["study", "sparse", "--img-size", "56", "--device", "cpu"],
     "--img-size 56 sets the input side of --model entries"),
    ("study-locality-missing-data", lambda d: ["study", "locality", "--conditions", "baseline", "--dataset", "cifar10",
                                               "--data-dir", str(d / "none"), "--epochs", "1", "--device", "cpu"],
     "none"),
]


NEEDS = {"open-clip": "open_clip", "hf-": "transformers"}  # optional extras some cases load


def _case(name, build, named):
    needed = [module for prefix, module in NEEDS.items() if name.startswith(prefix)]
    missing = [module for module in needed if importlib.util.find_spec(module) is None]
    return pytest.param(build, named, id=name, marks=pytest.mark.skipif(bool(missing), reason=f"no {missing}"))


@pytest.mark.parametrize(("build", "named"), [_case(*c) for c in CASES])
def test_each_refused_command_names_the_value_and_leaves_no_folder(build, named, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written by default lands here
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    scratch = tmp_path / "inputs"
    scratch.mkdir()
    argv = build(scratch)
    out = tmp_path / "out" / "deeper"
    line = refused([*argv, "--out", str(out / "model.safetensors" if argv[0] == "export" else out)], capsys)
    assert named in line
    assert not (tmp_path / "out").exists(), sorted(str(p) for p in (tmp_path / "out").rglob("*"))
    assert sorted(p.name for p in tmp_path.iterdir()) in (["inputs"], ["cache", "inputs"])


def test_demo_on_a_missing_gpu_writes_nothing(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = refused(["demo", "sparse", "--device", "cuda", "--out", str(tmp_path / "demo")], capsys)
    assert "no CUDA GPU is visible; use --device cpu" in line and not (tmp_path / "demo").exists()


def test_train_out_that_is_a_file_says_so(tmp_path, capsys):
    file = tmp_path / "run"
    file.write_text("mine")
    line = refused(["train", "--dataset", "synthetic", "--out", str(file)], capsys)
    assert f"run folder {file} is an existing file, not a folder" in line and file.read_text() == "mine"


def test_a_refused_rerun_keeps_the_existing_folder(tmp_path, capsys):
    """Only a folder the failed command created itself is removed: an existing --out stays, even empty."""
    out = tmp_path / "mine"
    out.mkdir()
    refused(["study", "registers", "--preset", "none", "--registers", "", "--model", "a=nope", "--out", str(out)],
            capsys)
    assert out.is_dir()


# ---- faults underneath a command ----

def test_a_full_disk_names_the_folder(tmp_path, capsys, monkeypatch):
    import vitscope.atomic_io

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")  # as json and numpy writers report it: no path

    monkeypatch.setattr(vitscope.atomic_io, "atomic_write_bytes", full)
    out = tmp_path / "norms"
    line = refused(["analyze", "norms", *PROBE, "--out", str(out)], capsys)
    assert f"the disk holding {out} is full" in line and "free space" in line


def test_torch_writer_failure_in_train_names_the_run_and_how_to_resume(tmp_path, capsys, monkeypatch):
    import vitscope.train.checkpoint

    def failing_save(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4310")

    monkeypatch.setattr(vitscope.train.checkpoint.torch, "save", failing_save)
    run = tmp_path / "run"
    line = refused(["train", "--dataset", "synthetic", "--device", "cpu", "--batch-size", "64", "--set",
                    "epochs=1", "model=vit-micro", "dataset_options.num_images=64", "eval_images=16",
                    "--out", str(run)], capsys)
    assert "is full" in line and f"vitscope train --resume {run}" in line
    assert not list((run / "checkpoints").glob(".tmp-step-*"))  # the half-written checkpoint is gone


def test_feature_cache_on_a_full_disk_is_refused_before_the_memory_map(tmp_path, capsys, monkeypatch):
    import vitscope.probes.features as features

    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(features.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1024))
    line = refused(["probe", "linear", *PROBE, "--out", str(tmp_path / "out")], capsys)
    assert f"the disk holding the feature cache {tmp_path / 'cache' / 'features'} is full" in line
    assert "VITSCOPE_CACHE" in line and "--no-cache" in line and not (tmp_path / "out").exists()
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_an_unwritable_cache_names_vitscope_cache_and_no_cache(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "file" / "cache"))
    line = refused(["probe", "linear", *PROBE, "--out", str(tmp_path / "out")], capsys)
    assert "VITSCOPE_CACHE" in line and "--no-cache" in line and str(tmp_path / "file") in line


def test_a_killed_feature_writers_temporary_is_removed_by_the_next_run(tmp_path):
    import os

    from vitscope.data import load_dataset
    from vitscope.models import create
    from vitscope.probes.features import extract_features

    for pid in range(4_000_000, 3_000_000, -1):  # a process id no process has
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
    stale = tmp_path / f".layer4-0123456789abcdef0123.npy.{pid}.tmp"
    live = tmp_path / f".layer4-0123456789abcdef0123.npy.{os.getpid()}.tmp"
    for temp in (stale, live):
        temp.write_bytes(b"\0" * 4096)
    data = load_dataset("synthetic", None, "eval", num_images=4)
    extract_features(create("vit-micro"), data, "last", batch_size=4, cache=tmp_path, progress=False)
    assert not stale.exists() and live.exists()


def test_a_run_folder_made_unwritable_mid_run_says_how_to_resume(tmp_path, capsys, monkeypatch):
    import vitscope.train.logging

    run = tmp_path / "run"
    real_open = open

    def unwritable(file, mode="r", *args, **kwargs):
        if str(file).startswith(str(run)) and str(file).endswith("metrics.jsonl") and "a" in mode:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(vitscope.train.logging, "open", unwritable, raising=False)
    line = refused(["train", "--dataset", "synthetic", "--device", "cpu", "--batch-size", "64", "--set",
                    "epochs=1", "model=vit-micro", "dataset_options.num_images=64", "eval_images=16",
                    "--out", str(run)], capsys)
    assert f"run folder {run} cannot be written" in line and f"vitscope train --resume {run}" in line


def test_a_full_disk_names_the_outputs_that_were_not_written(tmp_path, capsys, monkeypatch):
    """The disk fills while ``analyze norms`` writes its fourth output: the line names it, and the three before it,
    rather than leaving 3 of 4 outputs without a word."""
    import matplotlib.figure

    real_savefig = matplotlib.figure.Figure.savefig

    def fills_up(fig, fname, *args, **kwargs):
        if "high_norm_maps" in str(fname):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_savefig(fig, fname, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fills_up)
    out = tmp_path / "norms"
    line = refused(["analyze", "norms", *PROBE, "--out", str(out)], capsys)
    assert f"the disk holding {out} is full (no space left on device): high_norm_maps.png and the outputs after it " \
           "were not written (written before it: " in line
    written = line.split("written before it: ")[1].split(")")[0].split(", ")
    assert sorted(written) == ["norm_histograms.png", "norms.csv", "norms.json"]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(written)
    assert "run the command again" in line
