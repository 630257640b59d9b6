"""Checkpoints with a fallback: the last two are kept with their checksums, a damaged newest one is named and the
one before it used, and a resumed run's metrics.jsonl equals an uninterrupted run's (the open loss window is
part of the checkpoint)."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitscope.train import TrainConfig, train
from vitscope.train.checkpoint import CheckpointDamaged, complete_checkpoints
from vitscope.train.logging import read_metrics

# 4 steps per epoch, 8 in all; a log line every 3 steps and at each epoch's end; checkpoints at steps 4, 5, 8
TINY = {"model": "vit-micro", "model_options": {"depth": 1, "embed_dim": 16, "num_heads": 1},
        "dataset": "synthetic", "dataset_options": {"num_images": 128}, "eval_images": 32, "batch_size": 32,
        "warmup_epochs": 1, "epochs": 2, "progress": False, "device": "cpu", "log_every_steps": 3,
        "checkpoint_every_steps": 5}


def run(folder: Path, resume: bool = False, **changes) -> dict:
    return train(TrainConfig.from_dict({**TINY, "out": str(folder), **changes}), resume=resume)


def killed_after(folder: Path, step: int) -> None:
    """Leave ``folder`` (trained with keep_last=3) as a kill right after checkpoint ``step`` would: later
    checkpoints and the summary gone, LATEST naming ``step`` (later metrics rows are dropped by the resume)."""
    root = folder / "checkpoints"
    for checkpoint in root.glob("step-*"):
        if int(checkpoint.name.split("-")[1]) > step:
            shutil.rmtree(checkpoint)
    (root / "LATEST").write_text(f"step-{step:09d}")
    (folder / "summary.json").unlink()


def rows(folder: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "images_per_s"} for r in read_metrics(folder)]  # a wall-clock rate


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread) -> Path:
    folder = tmp_path_factory.mktemp("reference") / "run"
    run(folder)
    return folder


def test_keeps_the_last_two_checkpoints_with_their_checksums(reference):
    kept = complete_checkpoints(reference)
    assert [p.name for p in kept] == ["step-000000008", "step-000000005"]
    for checkpoint in kept:
        sums = dict(line.split("  ")[::-1] for line in (checkpoint / "SHA256SUMS").read_text().splitlines())
        assert set(sums) == {"model.safetensors", "state.pt"}


def test_resumed_metrics_equal_an_uninterrupted_runs(reference, tmp_path, one_thread):
    run(tmp_path / "run", keep_last=3)
    killed_after(tmp_path / "run", 5)  # mid-window: the line at step 7 averages steps 5, 6 and 7
    run(tmp_path / "run", resume=True, keep_last=3)
    assert [r["step"] for r in rows(reference) if r["kind"] == "train"] == [3, 4, 7, 8]
    assert rows(tmp_path / "run") == rows(reference)


@pytest.mark.parametrize("damaged", ["state.pt", "model.safetensors"])
def test_a_truncated_newest_checkpoint_falls_back_to_the_previous(reference, tmp_path, capsys, damaged, one_thread):
    folder = tmp_path / "run"
    run(folder, keep_last=3)
    killed_after(folder, 5)
    newest = folder / "checkpoints" / "step-000000005" / damaged
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    capsys.readouterr()
    summary = run(folder, resume=True, keep_last=3)
    lines = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert len(lines) == 1 and str(newest) in lines[0] and "resuming from step-000000004" in lines[0]
    assert summary["steps"] == 8
    final, expected = load_file(str(folder / "model.safetensors")), load_file(str(reference / "model.safetensors"))
    assert all(torch.equal(final[k], expected[k]) for k in expected)  # resumed from step 4, to the same weights
    assert rows(folder) == rows(reference)


def test_every_checkpoint_damaged_is_one_error_naming_the_newest(tmp_path, one_thread):
    folder = tmp_path / "run"
    run(folder, keep_last=3)
    killed_after(folder, 5)
    for checkpoint in complete_checkpoints(folder):
        (checkpoint / "state.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointDamaged, match=r"step-000000005/state.pt is damaged.*another --out"):
        run(folder, resume=True, keep_last=3)
    assert json.loads((folder / "config.json").read_text())  # the folder is left as it was


def dead_pid() -> int:
    """A process id that no process has now."""
    for pid in range(4_000_000, 3_000_000, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
    raise AssertionError("no free process id")


def test_an_unsummed_truncated_newest_model_falls_back_and_foreign_folders_are_ignored(reference, tmp_path,
                                                                                       capsys, one_thread):
    """A newest checkpoint without SHA256SUMS (written before sums existed) whose model is truncated is not
    used; a ``step-N.bak`` copy and a dead writer's temporary folder in checkpoints/ do not stop the resume."""
    folder = tmp_path / "run"
    run(folder, keep_last=3)
    killed_after(folder, 5)
    root = folder / "checkpoints"
    newest = root / "step-000000005"
    (newest / "SHA256SUMS").unlink()
    model = newest / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    shutil.copytree(root / "step-000000004", root / "step-000000004.bak")
    stale, live = root / f".tmp-step-000000006-{dead_pid()}", root / f".tmp-step-000000006-{os.getpid()}"
    for partial in (stale, live):
        partial.mkdir()
        (partial / "state.pt").write_bytes(b"half")
    capsys.readouterr()
    summary = run(folder, resume=True, keep_last=3)
    lines = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert len(lines) == 1 and str(model) in lines[0] and "resuming from step-000000004" in lines[0]
    assert summary["steps"] == 8 and rows(folder) == rows(reference)
    assert not stale.exists() and live.exists()  # only a writer that is gone leaves a stale one
    assert (root / "step-000000004.bak").is_dir()  # not ours: left alone
