"""Bad input, as a new user types it, is refused with one line on stderr naming the value and the fix (exit 2).

Most cases call ``vitscope.cli.main`` in-process (an error comes before any work); a few go through the real
``python -m vitscope.cli`` entry point.
"""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_refusals import refused
from vitscope.cli import main
from vitscope.models import create, save_model
from vitscope.train import TrainConfig, train

# (argv, what the line must name): each exited 0 with a wrong result, or printed argparse's usage block
ARGUMENT_CASES = [
    (["probe", "pca", "--count", "-2"], "--count: '-2' must be an integer >= 1"),
    (["probe", "pca", "--count", "0"], "--count: '0'"),
    (["probe", "pca", "--foreground", "2"], "--foreground: '2' must be a number in [0, 1]"),
    (["probe", "depth", "--max-depth", "-1"], "--max-depth -1.0 must be a depth in metres > 0"),
    (["probe", "depth", "--bin-resolution", "x8"], "--bin-resolution: invalid choice: 'x8'"),
    (["probe", "segment", "--size", "0"], "--size: '0'"),
    (["analyze", "norms", "--threshold", "absolute:-1"], "'absolute:-1': absolute:T needs a token norm T > 0"),
    (["study", "locality", "--seeds", "0,0"], "--seeds '0,0' must name distinct seeds (repeated: 0)"),
    (["study", "registers", "--detect-layer", "0"], "--detect-layer 0: token layers are numbered 1..L"),
    (["analyze", "norms", "--dataset", "synthetic", "--data-dir", "X"], "--data-dir X is not read by --dataset "
                                                                        "synthetic"),
    (["train", "--resume", "RUN", "--config", "OTHER.yaml"], "--config OTHER.yaml with --resume RUN"),
    (["analyze", "norms", "--batch-size", "0"], "--batch-size: '0' must be an integer >= 1"),
    (["analyze", "norms", "--num-registers", "1.5"], "--num-registers: invalid int value: '1.5'"),
    (["train", "--batch-size", "abc"], "--batch-size: 'abc'"),
    (["train", "--seed", "abc"], "--seed: invalid int value: 'abc'"),
    (["export", "--model", "vit-micro", "--format", "onnx", "--out", "x.safetensors"], "invalid choice: 'onnx'"),
    (["export", "--model", "vit-micro"], "required: --out"),
    (["nope"], "invalid choice: 'nope'"),
    (["analyze", "norms", "--nope"], "unrecognized arguments: --nope"),
    (["analyze", "norms", "--img-size", "100000"], "gives 625,000,000 patch tokens at vit-micro's patch size 4, "
                                                   "above the bound of 16,384; use at most 512 pixels"),
]


@pytest.mark.parametrize("argv, named", ARGUMENT_CASES, ids=[" ".join(a) for a, _ in ARGUMENT_CASES])
def test_bad_arguments_are_one_line(argv, named, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, but if it were it lands here
    line = refused(argv, capsys)
    assert named in line
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # refused before anything was written


def test_the_usage_stays_in_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--help"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: vitscope export")


def test_the_real_entry_point_prints_one_line():
    result = subprocess.run([sys.executable, "-m", "vitscope.cli", "train", "--num-registers", "1.5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("vitscope: error: unrecognized arguments: --num-registers 1.5; "
                                     "see `vitscope train --help`")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("weights")
    save_model(create("vit-micro"), folder / "good.safetensors")
    good = (folder / "good.safetensors").read_bytes()
    (folder / "empty.safetensors").write_bytes(b"")
    (folder / "text.safetensors").write_text("these are not weights\n")
    (folder / "truncated.safetensors").write_bytes(good[: len(good) // 2])
    (folder / "header.safetensors").write_bytes(good[:20])
    (folder / "text.pth").write_text("hello")
    save_model(create("vit-compact"), folder / "other.safetensors")
    torch.save(create("vit-compact").state_dict(), folder / "other.pth")
    return folder


INVALID = ["empty.safetensors", "text.safetensors", "truncated.safetensors", "header.safetensors"]


@pytest.mark.parametrize("how, name", [("--weights", n) for n in [*INVALID, "text.pth"]]
                         + [("--model", n) for n in INVALID])  # a .pth file is foreign weights: --weights only
def test_an_invalid_weights_file_is_named(weights, name, how, capsys, tmp_path):
    line = refused(["analyze", "norms", "--out", str(tmp_path), how, str(weights / name)], capsys)
    assert f"{weights / name} is not a valid checkpoint" in line


@pytest.mark.parametrize("spec, name, listed", [
    ("vit-micro", "other.safetensors", "mismatched (file vs model) ['blocks.0.attn.proj.bias [192] vs [64]'"),
    ("vit-micro", "other.pth", "unexpected ['blocks.4.norm1.weight'"),
])  # timm: specs load through the models/ loader being rewritten on another branch (origins), not covered here
def test_weights_of_another_architecture_list_the_keys(weights, spec, name, listed, capsys, tmp_path):
    line = refused(["analyze", "norms", "--model", spec, "--weights", str(weights / name), "--out", str(tmp_path)],
                   capsys)
    assert f"weights in {weights / name} do not fit the model" in line and listed in line
    assert "check that the model spec matches the checkpoint" in line


@pytest.mark.parametrize("suffix, text, where", [
    (".yaml", "epochs: 2\nlr: 1e-3\nseed: [3\n", "invalid YAML at line 4, column 1"),
    (".json", '{\n  "epochs": 2,\n  "lr": ,\n}\n', "invalid JSON at line 3, column 9"),
    (".toml", "epochs = 2\nlr =\n", "(at line 2, column 5)"),
])
def test_config_syntax_errors_name_file_line_and_column(suffix, text, where, tmp_path, capsys):
    path = tmp_path / f"bad{suffix}"
    path.write_text(text)
    line = refused(["train", "--config", str(path), "--out", str(tmp_path / "run")], capsys)
    assert f"config file {path}: " in line and where in line


def test_set_values_and_dataset_options_are_checked(tmp_path, capsys):
    out = ["--out", str(tmp_path / "run")]
    assert "--set 'lr=[1,': invalid YAML at line 1, column 4" in refused(["train", "--set", "lr=[1,", *out], capsys)
    line = refused(["train", "--set", "dataset_options.nmu_images=8", *out], capsys)
    assert "dataset_options key(s) nmu_images unknown for dataset synthetic; valid keys: cue, image_size" in line
    assert not (tmp_path / "run").exists()


def image_folder(root: Path, classes: dict[str, list[str]], broken: str | None = None) -> Path:
    rng = np.random.default_rng(0)
    for split, names in classes.items():
        for name in names:
            (root / split / name).mkdir(parents=True)
            for i in range(4):
                image = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(image).save(root / split / name / f"{i}.png")
    if broken:
        (root / broken).write_bytes(b"not an image")
    return root


TINY = ["--set", "model=vit-micro", "--set", "model_options={depth: 1, embed_dim: 16, num_heads: 1, img_size: 16, "
        "patch_size: 4}", "--set", "epochs=1", "--set", "progress=false", "--set", "warmup_epochs=0",
        "--device", "cpu", "--batch-size", "4"]


def test_splits_with_different_classes_are_refused_before_training(tmp_path, capsys):
    data = image_folder(tmp_path / "data", {"train": ["cat", "dog"], "val": ["cat", "emu"]})
    run = tmp_path / "run"
    line = refused(["train", "--dataset", "imagefolder", "--data-dir", str(data), "--out", str(run), *TINY], capsys)
    assert "have different classes (2 and 2; in one split only: dog, emu)" in line
    assert not run.exists()  # no partial run folder


@pytest.mark.parametrize("stream", ["false", "true"])
def test_a_corrupt_training_image_is_named_with_the_fix(tmp_path, capsys, stream):
    data = image_folder(tmp_path / "data", {"train": ["cat", "dog"], "val": ["cat", "dog"]}, "train/dog/2.png")
    line = refused(["train", "--dataset", "imagefolder", "--data-dir", str(data), "--out", str(tmp_path / "run"),
                    "--set", f"stream={stream}", *TINY], capsys)
    assert f"cannot decode image {data / 'train/dog/2.png'}: not a readable image file; re-create or remove" in line


def test_an_error_in_a_data_worker_prints_the_workers_message(capsys, monkeypatch, tmp_path):
    from torch.utils.data._utils import ExceptionWrapper

    import vitscope.cli.export as export

    monkeypatch.chdir(tmp_path)

    def worker_fails(_args):  # a streamed image not among those sampled before training fails in a worker
        try:
            raise ValueError("cannot decode image /data/train/a/9.jpg: bad header; re-create or remove this file")
        except ValueError:
            ExceptionWrapper(where="in DataLoader worker process 0").reraise()

    monkeypatch.setattr(export, "run", worker_fails)
    line = refused(["export", "--model", "vit-micro", "--out", "x.safetensors"], capsys)
    assert line == ("vitscope: error: cannot decode image /data/train/a/9.jpg: bad header; re-create or remove this "
                    "file")


def test_resume_of_something_that_is_not_a_run_folder(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    for folder in (tmp_path, tmp_path / "missing"):
        assert f"{folder} is not a vitscope run folder" in refused(["train", "--resume", str(folder)], capsys)


def test_a_truncated_state_on_resume_is_named(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = {"model": "vit-micro", "model_options": {"depth": 1, "embed_dim": 16, "num_heads": 1}, "epochs": 1,
           "dataset_options": {"num_images": 32}, "eval_images": 16, "batch_size": 16, "warmup_epochs": 1,
           "progress": False, "device": "cpu", "out": str(run), "checkpoint_every_steps": 1}
    train(TrainConfig.from_dict(cfg))
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    for state in (run / "checkpoints").glob("step-*/state.pt"):
        state.write_bytes(state.read_bytes()[:100])
    line = refused(["train", "--resume", str(run)], capsys)
    assert f"{run}/checkpoints/step-000000002/state.pt is damaged" in line and "another --out" in line


def test_a_read_only_run_folder_names_the_folder_and_the_fix(tmp_path, capsys, monkeypatch):
    import vitscope.train.checkpoint as checkpoint

    def refuse(_model, path):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(checkpoint, "save_model", refuse)
    run = tmp_path / "run"
    line = refused(["train", "--out", str(run), "--set", "dataset_options.num_images=32", *TINY], capsys)
    assert f"in run folder {run} (Operation not permitted); make the folder writable (chmod -R u+w {run})" in line
    assert ".tmp-step" not in line


def test_launcher_slurm_without_slurm(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    line = refused(["study", "locality", "--launcher", "slurm", "--out", str(tmp_path)], capsys)
    assert "--launcher slurm needs a SLURM cluster" in line and "--launcher local" in line


def test_export_out_that_cannot_be_written_names_out(tmp_path, capsys):
    line = refused(["export", "--model", "vit-micro", "--out", "/proc/e.safetensors"], capsys)
    assert "--out /proc/e.safetensors cannot be written" in line and ".tmp" not in line


def test_download_without_a_network_names_the_local_file(tmp_path, capsys, monkeypatch):
    def offline(*_args, **_kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", offline)  # never touch the network in a test
    line = refused(["analyze", "norms", "--dataset", "cifar10", "--data-dir", str(tmp_path / "cifar"), "--download",
                    "--out", str(tmp_path / "out")], capsys)
    assert "--download cannot reach www.cs.toronto.edu (Network is unreachable)" in line
    assert "put cifar-10-python.tar.gz (from https://www.cs.toronto.edu/" in line and str(tmp_path / "cifar") in line
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "Nothing is ever downloaded" not in readme and "`--download`" in readme


def test_refusals_wrote_nothing_into_an_existing_run(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"config": {}}))
    refused(["train", "--resume", str(tmp_path), "--config", "x.yaml"], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_train_on_mixed_sizes_is_told_the_option_train_takes(tmp_path, capsys, monkeypatch):
    """The refusal of a folder of mixed sizes told ``train`` to pass --img-size, which train refuses; the option it
    names for train must be one train takes, and it must work."""
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    data = image_folder(tmp_path / "data", {"train": ["cat", "dog"], "val": ["cat", "dog"]})
    Image.fromarray(np.zeros((20, 12, 3), np.uint8)).save(data / "train" / "cat" / "0.png")
    argv = ["train", "--dataset", "imagefolder", "--data-dir", str(data), *TINY]
    line = refused([*argv, "--out", str(tmp_path / "run")], capsys)
    assert "have different sizes (16x16, 20x12)" in line and "--set dataset_options.image_size=S for train" in line
    refused([*argv, "--img-size", "16", "--out", str(tmp_path / "run")], capsys)  # what it no longer tells train
    assert main([*argv, "--set", "dataset_options.image_size=16", "--out", str(tmp_path / "run")]) == 0


def test_training_notices_come_after_the_first_step(tmp_path, capsys):
    """The warmup notice is still said (after the first step, so that a refused run prints its line alone)."""
    assert main(["train", "--out", str(tmp_path / "run"), "--set", "dataset_options.num_images=32",
                 *TINY, "--set", "warmup_epochs=2"]) == 0  # the later --set wins
    assert capsys.readouterr().err.count("warmup_epochs=2 is not shorter than epochs=1") == 1
