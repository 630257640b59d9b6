"""A study folder is one study: a rerun with other settings is refused (not resumed into, not reported as the
new settings), a rerun with the same settings resumes, and one study writes a folder at a time."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vitscope.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
RUN_FOLDER_PY = Path(__file__).resolve().parents[1] / "src" / "vitscope" / "run_folder.py"
LOCALITY = ["study", "locality", "--conditions", "baseline", "--train-images", "64", "--eval-images", "16",
            "--batch-size", "32", "--device", "cpu"]


def test_locality_rerun_with_other_epochs_is_refused_and_the_same_resumes(tmp_path, capsys):
    out = tmp_path / "study"
    assert main([*LOCALITY, "--epochs", "1", "--out", str(out)]) == 0
    results = (out / "results.json").read_bytes()
    capsys.readouterr()
    assert main([*LOCALITY, "--epochs", "2", "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vitscope: error:")]
    assert len(err) == 1  # beside the schedule note, which says how a short run's warmup is scaled
    err = err[0]
    assert "epochs=1" in err and "epochs=2" in err and "--epochs 1" in err and "another --out" in err
    assert (out / "results.json").read_bytes() == results  # the provenance still says what was run
    run = out / "runs" / "baseline" / "seed-0"
    for name in ("summary.json", "locality.json"):  # as a run stopped before it finished
        (run / name).unlink()
    assert main([*LOCALITY, "--epochs", "1", "--out", str(out)]) == 0  # unchanged settings: resumed
    saved = json.loads((out / "results.json").read_text())
    assert saved["runs"][0]["train_config"]["epochs"] == 1


def test_registers_study_holds_its_folder_lock_until_the_report(tmp_path, monkeypatch, capsys):
    """A second writer is refused while the first measures and writes its report, not only while it trains."""
    import vitscope.report.registers.page as page

    seen = {}
    build_report = page.build_report

    def probing_build_report(out):
        probe = "import importlib.util, sys\n" \
                "spec = importlib.util.spec_from_file_location('rf', sys.argv[1])\n" \
                "rf = importlib.util.module_from_spec(spec); spec.loader.exec_module(rf)\n" \
                "try:\n    with rf.writer_lock(sys.argv[2]):\n        print('free')\n" \
                "except rf.FolderInUse:\n    print('held')\n"
        seen["lock"] = subprocess.run([sys.executable, "-c", probe, str(RUN_FOLDER_PY), str(out)],
                                      capture_output=True, text=True, timeout=60).stdout.strip()
        return build_report(out)

    monkeypatch.setattr(page, "build_report", probing_build_report)
    out = tmp_path / "reg"
    assert main(["study", "registers", "--preset", "none", "--registers", "", "--model", "a=vit-micro",
                 "--eval-images", "8", "--no-probes", "--thresholds", "auto", "--device", "cpu",
                 "--out", str(out)]) == 0
    assert seen["lock"] == "held"


def test_sparse_label_reused_for_another_model_is_refused(tmp_path, capsys):
    """A given model's cached measurement is reused only for the same model, never for another under its label."""
    record = tmp_path / "study" / "runs" / "a" / "seed-0" / "sparse.json"
    record.parent.mkdir(parents=True)
    cached = {"label": "a", "spec": "vit-micro", "weights": None, "options": {}, "thresholds": []}
    record.write_text(json.dumps({"source": {"given": cached}}))
    assert main(["study", "sparse", "--conditions", "", "--model", "a=vit-compact", "--device", "cpu",
                 "--out", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds the measurement of vit-micro" in err and "another label" in err
