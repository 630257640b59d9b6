"""The locality study: resumable, results files, claims, and a report that renders in a real browser."""

import csv
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vitscope.report.locality.page import build_report
from vitscope.studies.locality.readings import min_early_mad, stated
from vitscope.studies.locality.records import LocalityRun
from vitscope.studies.locality.results import LocalityResults, summarize
from vitscope.studies.locality.study import LocalityStudy, run
from vitscope.studies.locality.verdicts import judge_runs

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def tiny_study(out: Path, **changes) -> LocalityStudy:
    options = {"conditions": ["baseline", "baseline+cutmix"], "seeds": [0, 1], "epochs": 1, "train_images": 256,
               "eval_images": 32, "batch_size": 64, "device": "cpu", "out": str(out), "progress": False}
    return LocalityStudy(**{**options, **changes})


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    study = tiny_study(out)
    run(study)
    build_report(out)
    return out


def test_results_files(finished_study):
    out = finished_study
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * 2 * 4 * 4  # conditions x seeds x layers x heads
    assert float(rows[0]["mad_cls_at_zero"]) < float(rows[0]["mad"])  # both MAD readings, per head
    assert {r["condition"] for r in rows} == {"baseline", "baseline+cutmix"} and {r["layer"] for r in rows} == {
        "1", "2", "3", "4"}
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert [s["condition"] for s in summary] == ["baseline", "baseline+cutmix"] and summary[0]["seeds"] == "2"
    payload = json.loads((out / "results.json").read_text())
    assert payload["schema_version"] == 2 and payload["study"] == "locality" and payload["kind"] == "locality-study"
    assert payload["provenance"]["dataset"] == "synthetic"
    results = LocalityResults.read(out)  # the typed results the report reads, every registry claim judged once
    assert [j.claim_id for j in results.claims][:3] == ["L1", "L1-entropy", "L2"]
    assert results.runs[0].mad_cls_at_zero and results.settings["conditions"] == ["baseline", "baseline+cutmix"]
    # the numbers in the table are those of each run's own analysis file
    run_file = json.loads((out / "runs" / "baseline" / "seed-1" / "locality.json").read_text())
    mine = [float(r["mad"]) for r in rows if r["condition"] == "baseline" and r["seed"] == "1"]
    assert np.allclose(mine, np.asarray(run_file["mad"]).ravel())


def test_rerun_reuses_finished_work(finished_study):
    before = {p: p.stat().st_mtime_ns for p in finished_study.glob("runs/*/*/model.safetensors")}
    run(tiny_study(finished_study))
    after = {p: p.stat().st_mtime_ns for p in finished_study.glob("runs/*/*/model.safetensors")}
    assert before == after and len(before) == 4


def test_killed_study_completes_on_rerun(tmp_path):
    study = tiny_study(tmp_path / "s", seeds=[0])
    run(study)
    # simulate a kill: one run lost its analysis and final weights, keeping only a mid-run checkpoint state
    victim = study.run_dir("baseline+cutmix", 0)
    (victim / "locality.json").unlink()
    (victim / "summary.json").unlink()
    (victim / "model.safetensors").unlink()
    payload = run(study)
    assert {r.condition for r in payload.runs} == {"baseline", "baseline+cutmix"}
    assert (victim / "locality.json").is_file() and (victim / "model.safetensors").is_file()


def test_claims_with_known_answers():
    def record(condition, seed, early, acc):
        mad = np.full((8, 8), 0.4)
        mad[:2] = early
        return LocalityRun(condition, seed, accuracy=acc, mad=mad.tolist(), entropy=np.ones((8, 8)).tolist(),
                           grid_size=[8, 8])

    records = [record("baseline", s, 0.3 + 0.01 * s, 0.50 + 0.001 * s) for s in range(3)]
    records += [record("baseline+cutmix", s, 0.01 + 0.001 * s, 0.56 + 0.002 * s) for s in range(3)]
    assert min_early_mad(records[0], stated(8)) == pytest.approx(0.3)
    found = {j.claim_id: j for j in judge_runs(records, dataset="synthetic")}
    l4 = found["L4"]  # the one pair with - without, closest pair shown as a - b
    assert l4.difference == pytest.approx(0.011 - 0.31, abs=1e-9)
    assert l4.ci95_high < 0 and l4.verdict == "reproduced" and "Welch t" in l4.method
    assert found["L6-cutmix"].difference == pytest.approx(0.061)
    rows = summarize(records)
    assert rows[0]["min_early_mad_mean"] == pytest.approx(0.31) and rows[1]["accuracy_mean"] == pytest.approx(0.562)


def test_bad_study_options():
    with pytest.raises(ValueError, match="unknown component"):
        LocalityStudy(conditions=["baseline+dropout"])
    with pytest.raises(ValueError, match="preset"):
        LocalityStudy(preset="huge")


def test_img_size_views_the_images_at_that_size_and_only_when_asked():
    asked = LocalityStudy(dataset="cifar10", data_dir="x", img_size=48).train_config("baseline", 0, "cpu")
    assert asked.dataset_options == {"image_size": 48}
    native = LocalityStudy(dataset="cifar10", data_dir="x").train_config("baseline", 0, "cpu")
    assert native.dataset_options == {}  # a study that asks nothing trains on the images' own pixels, as before
    scenes = LocalityStudy(img_size=40).train_config("baseline", 0, "cpu")
    assert scenes.dataset_options == {"num_images": 4096, "num_classes": 8, "image_size": 40}


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_report_renders_in_headless_chromium(finished_study, tmp_path):
    report = finished_study / "report.html"
    text = report.read_text()
    assert "src=\"http" not in text and "<script" not in text  # self-contained
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}",
                          "--virtual-time-budget=3000", "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    assert dom.stdout.count("<img") >= 6 and dom.stdout.count("<table") >= 5
    assert "Claims checked" in dom.stdout and "baseline+cutmix" in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--no-first-run", f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                    "--window-size=1200,3000", report.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000  # figures were decoded and painted


@pytest.mark.real_model  # real photos at length (26 s): run apart with the real-model tests
@pytest.mark.skipif(not (SHARED / "cifar10_jpg.tar.gz").exists(), reason="../shared/data is not present")
def test_real_cifar10_images_tiny_run(tmp_path, monkeypatch):
    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    study = LocalityStudy(dataset="cifar10", data_dir=str(SHARED / "cifar10_jpg.tar.gz"), conditions=["baseline"],
                          seeds=[0], preset="paper", epochs=1, train_images=256, eval_images=64, batch_size=64,
                          device="cpu", out=str(tmp_path / "cifar"), progress=False)
    payload = run(study)
    record = payload.runs[0]
    assert record.grid_size == [8, 8] and record.train_config["model"] == "vit-compact"
    assert len(record.mad) == 8 and record.num_images == 64 and record.accuracy is not None
    assert "CIFAR-10" in payload.claims[0].scope


def test_runs_side_by_side_one_per_device(tmp_path, monkeypatch):
    import vitscope.studies.runner as runner

    monkeypatch.setattr(runner, "devices", lambda device: ["cpu", "cpu"])  # stands in for two GPUs
    payload = run(tiny_study(tmp_path / "pool", seeds=[0]))
    assert sorted(r.condition for r in payload.runs) == ["baseline", "baseline+cutmix"]


def test_submitit_launcher_runs_each_condition_as_a_job(tmp_path):
    pytest.importorskip("submitit")
    payload = run(tiny_study(tmp_path / "jobs", seeds=[0], launcher="submitit-local"))
    assert sorted(r.condition for r in payload.runs) == ["baseline", "baseline+cutmix"]
    assert list((tmp_path / "jobs" / "submitit").glob("*_log.out"))


def _multipliers(cfg, steps_per_epoch):
    from vitscope.train.schedules import lr_multiplier

    return [lr_multiplier(s, cfg, steps_per_epoch) for s in range(cfg.epochs * steps_per_epoch)]


def test_a_run_shorter_than_the_presets_warmup_still_reaches_the_peak_learning_rate(capsys):
    """--epochs 1 with the demo preset's 2 warmup epochs never reached lr (the multiplier stopped at 0.5) and said
    nothing; the warmup now scales with the run (2 of 10 epochs -> 0.2 of 1) and one line says so."""
    study = LocalityStudy(preset="demo", epochs=1, out="unused")
    cfg = study.train_config("baseline", 0, "cpu")
    assert cfg.warmup_epochs == pytest.approx(0.2)
    multipliers = _multipliers(cfg, 390)
    assert max(multipliers) == pytest.approx(1.0) and multipliers[-1] < 0.01  # peak reached, then decayed
    note = study.schedule_note()
    assert "--epochs 1" in note and "2 warmup epochs" in note and "0.2 epochs" in note


def test_a_run_whose_warmup_fits_keeps_its_schedule_exactly():
    """The long demo run (--epochs 50, CIFAR-10: 390 steps per epoch) resumes with this code: 2 warmup epochs
    (780 steps), linear to lr, then half-cosine to min_lr, step for step as before."""
    import math

    study = LocalityStudy(preset="demo", epochs=50, out="unused")
    cfg = study.train_config("baseline", 0, "cpu")
    assert cfg.warmup_epochs == 2 and study.schedule_note() is None
    warm, total, floor = 780, 50 * 390, 1e-5 / 2e-3
    expected = [(s + 1) / warm if s < warm else floor + (1 - floor) * 0.5 * (
        1 + math.cos(math.pi * ((s - warm) / (total - warm)))) for s in range(total)]
    assert _multipliers(cfg, 390) == expected


def test_the_engine_names_a_warmup_that_does_not_fit():
    from vitscope.train import TrainConfig
    from vitscope.train.schedules import warmup_note

    assert warmup_note(TrainConfig(epochs=3, warmup_epochs=2)) is None
    note = warmup_note(TrainConfig(epochs=1, warmup_epochs=2, lr=0.002))
    assert "warmup_epochs=2" in note and "epochs=1" in note and "lr=0.002" in note and "\n" not in note
