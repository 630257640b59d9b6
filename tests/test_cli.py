"""The vitscope command: output files, one-line errors, --debug."""

import json
import subprocess
import sys

import pytest

from vitscope.cli import main


def test_version_and_models(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert "vitscope 0." in capsys.readouterr().out
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "vit-compact" in out and "2,417,956" in out


def test_analyze_locality_writes_files(tmp_path, capsys):
    out = tmp_path / "loc"
    code = main(["analyze", "locality", "--model", "vit-micro", "--dataset", "synthetic", "--num-images", "24",
                 "--batch-size", "8", "--device", "cpu", "--out", str(out), "--unit", "patch"])
    assert code == 0
    payload = json.loads((out / "locality.json").read_text())
    assert payload["metric_options"] == {"renormalize": True, "unit": "patch"}
    assert payload["provenance"]["dataset"] == "synthetic" and payload["provenance"]["schema_version"] == 1
    assert {"torch_version", "timm_version", "vitscope_version", "device", "seed"} <= set(payload["provenance"])
    assert len(payload["heads"]) == 4 * 4 and payload["heads"][0]["images"] == 24
    assert payload["summary"]["accuracy"] is None  # 10-class head on 8-class data: no accuracy claimed
    csv_lines = (out / "locality.csv").read_text().splitlines()
    assert csv_lines[0] == "layer,head,mad,entropy,images,skipped" and len(csv_lines) == 17
    assert (out / "behaviour_space.png").read_bytes()[:4] == b"\x89PNG"


def test_errors_are_one_line_and_exit_2(tmp_path):
    cmd = [sys.executable, "-m", "vitscope.cli", "analyze", "locality", "--model", "vit-nope", "--out", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown model spec 'vit-nope'" in result.stderr
    assert "Traceback" not in result.stderr
    debug = subprocess.run([cmd[0], "-m", "vitscope.cli", "--debug", *cmd[3:]], capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
