"""`vitscope study locality --pack K|auto`: the same results as the unpacked study, within float tolerance."""

import json
import subprocess
import sys

import numpy as np
import pytest

from vitscope.studies.locality.study import LocalityStudy, run


def tiny(out, **changes) -> LocalityStudy:
    options = {"conditions": ["baseline", "baseline+cutmix"], "seeds": [0], "epochs": 1, "train_images": 128,
               "eval_images": 32, "batch_size": 32, "device": "cpu", "out": str(out), "progress": False}
    return LocalityStudy(**{**options, **changes})


def test_packed_study_equals_unpacked(tmp_path):
    solo = run(tiny(tmp_path / "solo"))
    packed = run(tiny(tmp_path / "packed", pack="auto"))  # auto on CPU: both runs in one pack
    assert (tmp_path / "packed" / "runs" / "baseline+cutmix" / "seed-0" / "summary.json").is_file()
    for a, b in zip(solo.runs, packed.runs, strict=True):
        assert (a.condition, a.seed) == (b.condition, b.seed)
        np.testing.assert_allclose(a.mad, b.mad, atol=1e-4)
        np.testing.assert_allclose(a.mad_cls_at_zero, b.mad_cls_at_zero, atol=1e-4)
        np.testing.assert_allclose(a.entropy, b.entropy, atol=1e-4)
        assert abs(a.accuracy - b.accuracy) <= 1 / 32
    assert json.loads((tmp_path / "packed" / "results.json").read_text())["rows"]


def test_bad_pack_is_one_line_exit_2(tmp_path):
    with pytest.raises(ValueError, match="pack='many'"):
        tiny(tmp_path, pack="many")
    proc = subprocess.run([sys.executable, "-m", "vitscope.cli", "study", "locality", "--pack", "0",
                           "--out", str(tmp_path / "s")], capture_output=True, text=True)
    assert proc.returncode == 2 and "pack='0'" in proc.stderr and "Traceback" not in proc.stderr
