"""DINO's collapse monitors (teacher entropy, KL teacher-centre) survive a resume mid log window: the first metrics
row after a resume averages the same steps as an uninterrupted run's (docs/training.md)."""

import os
import signal
from pathlib import Path

import pytest

from test_dino import dino_config
from vitscope.train import TrainingInterrupted, train
from vitscope.train.dino.objective import DinoObjective
from vitscope.train.logging import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
MONITORS = ("teacher_entropy", "kl_teacher_centre")


def train_rows(run: str) -> list[dict]:
    return [m for m in read_metrics(Path(run)) if m["kind"] == "train"]


def test_first_row_after_a_resume_mid_window_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    common = {"deterministic": True, "log_every_steps": 2, "epochs": 1}
    reference = dino_config(tmp_path, "reference", **common)
    train(reference)
    victim = dino_config(tmp_path, "victim", **common)
    step = DinoObjective.after_optimizer_step

    def stop_after_the_first_step(self, global_step, total_steps):
        step(self, global_step, total_steps)
        if global_step == 0:  # SIGINT: the engine checkpoints step 1, inside the 2-step log window, and stops
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(DinoObjective, "after_optimizer_step", stop_after_the_first_step)
    with pytest.raises(TrainingInterrupted, match="at step 1"):
        train(victim)
    monkeypatch.undo()
    train(victim, resume=True)
    ours, theirs = train_rows(victim.out), train_rows(reference.out)
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] and ours[0]["step"] == 2
    for a, b in zip(ours, theirs, strict=True):
        for key in (*MONITORS, "loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)
