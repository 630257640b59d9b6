"""The trainer: it learns, resumes bit-exactly after SIGKILL / SIGTERM, stops on NaN, runs under torchrun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitscope.train import TrainConfig, TrainingDiverged, train
from vitscope.train.checkpoint import latest_checkpoint
from vitscope.train.logging import read_metrics

TINY = {"model": "vit-micro", "model_options": {"depth": 2, "embed_dim": 32, "num_heads": 2},
        "dataset": "synthetic", "dataset_options": {"num_images": 256}, "eval_images": 64, "batch_size": 32,
        "warmup_epochs": 1, "progress": False, "log_every_steps": 2, "device": "cpu"}


def config(tmp_path: Path, name: str, **changes) -> TrainConfig:
    return TrainConfig.from_dict({**TINY, "out": str(tmp_path / name), **changes})


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model.safetensors"))


def launch(cfg: TrainConfig, tmp_path: Path) -> subprocess.Popen:
    path = tmp_path / f"{Path(cfg.out).name}.json"
    path.write_text(json.dumps(cfg.to_dict()))
    return subprocess.Popen([sys.executable, "-m", "vitscope.cli", "train", "--config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(run: Path, proc: subprocess.Popen, min_step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ckpt = latest_checkpoint(run)
        if ckpt is not None and int(ckpt.name.split("-")[1]) >= min_step:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


def kill_and_resume(run: Path, proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """SIGKILL a training run that has not finished, then `vitscope train --resume` it to the end."""
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (run / "summary.json").exists(), "the run finished before it was killed"
    resumed = subprocess.run([sys.executable, "-m", "vitscope.cli", "train", "--resume", str(run)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    return resumed


def test_learns_and_writes_a_complete_run_folder(tmp_path):
    cfg = config(tmp_path, "learn", epochs=5, protocol="baseline", lr=2e-3, model_options={}, batch_size=64,
                 dataset_options={"num_images": 2048, "num_classes": 2}, eval_images=256, log_every_steps=32)
    summary = train(cfg)
    run = Path(cfg.out)
    assert {"config.json", "metrics.jsonl", "model.safetensors", "summary.json", "tensorboard"} <= {
        p.name for p in run.iterdir()}
    evals = [m for m in read_metrics(run) if m["kind"] == "eval"]
    assert len(evals) == 5 and summary["eval"] == {k: evals[-1][k] for k in ("top1", "loss")}
    assert evals[-1]["top1"] > 0.6  # bars against rings: well above chance after a few epochs
    losses = [m["loss"] for m in read_metrics(run) if m["kind"] == "train"]
    assert losses[-1] < losses[0] - 0.15
    meta = json.loads((run / "config.json").read_text())
    assert meta["config"]["protocol"] == "baseline" and meta["schema_version"] == 1 and "torch_version" in meta
    assert list((run / "tensorboard").iterdir())


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_interrupted_run_resumes_to_identical_weights(tmp_path, how):
    common = {"epochs": 4, "protocol": "modern", "deterministic": True, "checkpoint_every_steps": 1}
    reference = config(tmp_path, "reference", **common)
    train(reference)
    victim = config(tmp_path, "victim", **common)
    proc = launch(victim, tmp_path)
    wait_for_checkpoint(Path(victim.out), proc, min_step=6)
    proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=60)
    if how == "SIGTERM":
        assert proc.returncode == 130 and "--resume" in err
    assert not (Path(victim.out) / "summary.json").exists(), "the run finished before it was interrupted"
    step = int(latest_checkpoint(Path(victim.out)).name.split("-")[1])
    assert 6 <= step < 32
    resumed = subprocess.run([sys.executable, "-m", "vitscope.cli", "train", "--resume", victim.out],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    ours, theirs = weights(Path(victim.out)), weights(Path(reference.out))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    steps = [m["step"] for m in read_metrics(Path(victim.out)) if m["kind"] == "train"]
    assert steps == sorted(set(steps))  # no duplicated log lines after the resume


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    import vitscope.train.trainer as trainer

    calls = {"n": 0}
    real = trainer.soft_cross_entropy

    def poisoned(logits, targets):
        calls["n"] += 1
        loss = real(logits, targets)
        return loss * float("nan") if calls["n"] > 12 else loss

    monkeypatch.setattr(trainer, "soft_cross_entropy", poisoned)
    cfg = config(tmp_path, "nan", epochs=3, checkpoint_every_steps=4)
    with pytest.raises(TrainingDiverged, match="last good checkpoint"):
        train(cfg)
    ckpt = latest_checkpoint(Path(cfg.out))
    assert ckpt is not None and int(ckpt.name.split("-")[1]) <= 12
    assert all(torch.isfinite(t).all() for t in load_file(str(ckpt / "model.safetensors")).values())


def test_refuses_to_overwrite_a_run_and_validates_config(tmp_path):
    cfg = config(tmp_path, "once", epochs=1)
    train(cfg)
    with pytest.raises(ValueError, match="--resume"):
        train(cfg)
    assert train(cfg, resume=True)["steps"] == 8  # a finished run resumes to its summary
    with pytest.raises(ValueError, match="valid keys"):
        TrainConfig.from_dict({"epochz": 3})
    with pytest.raises(ValueError, match="batch_size"):
        train(config(tmp_path, "big", batch_size=4096))
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        train(config(tmp_path, "nodata", dataset="cifar10", data_dir=str(tmp_path / "nope"), dataset_options={}))


def test_two_ranks_with_gloo_under_torchrun(tmp_path):
    cfg = config(tmp_path, "ddp", epochs=1, batch_size=32)
    path = tmp_path / "ddp.json"
    path.write_text(json.dumps(cfg.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = tmp_path / "torchrun-logs"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", "29533", "--log-dir", str(logs), "--tee", "3",
                             "-m", "vitscope.cli", "train", "--config", str(path)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {p.parent.name for p in logs.rglob("stderr.log")} == {"0", "1"}  # two worker processes ran
    meta = json.loads((Path(cfg.out) / "config.json").read_text())
    assert meta["world_size"] == 2
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["steps"] == 8 and 0 <= summary["eval"]["top1"] <= 1


def test_config_files_and_dotted_overrides(tmp_path):
    from vitscope.train import load_config

    (tmp_path / "c.yaml").write_text("model: vit-micro\nepochs: 3\nmodel_options:\n  depth: 2\n")
    cfg = load_config(tmp_path / "c.yaml", ["model_options.num_registers=4", "lr=0.002", "protocol=modern-cutmix"])
    assert cfg.epochs == 3 and cfg.lr == 0.002 and cfg.model_options == {"depth": 2, "num_registers": 4}
    assert cfg.protocol == "modern-cutmix"
    (tmp_path / "c.toml").write_text('model = "vit-micro"\nprotocol = "baseline+cutmix+labelsmoothing"\n')
    assert load_config(tmp_path / "c.toml").protocol == "modern-autoaugment"
    with pytest.raises(ValueError, match="key=value"):
        load_config(None, ["epochs"])
    with pytest.raises(FileNotFoundError, match="--config"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="fetches cifar10 and cifar100"):  # (a folder that is there needs none)
        from vitscope.data import load_dataset

        load_dataset("tiny-imagenet", tmp_path / "missing", "train", download=True)
