"""The study runner: finished runs are reused, records are written atomically, runs go side by side."""

import json
from pathlib import Path

import pytest

import vitscope.studies.runner as runner
from vitscope.studies.runner import Launch, RunSpec, run_all


def _work(spec: RunSpec, device: str) -> dict:
    """Counts its calls in a file of the run folder (works across processes)."""
    folder = spec.folder(Path(device.split("|")[1]))
    folder.mkdir(parents=True, exist_ok=True)
    calls = folder / "calls"
    calls.write_text(str(int(calls.read_text()) + 1 if calls.exists() else 1))
    if spec.condition == "boom":
        raise RuntimeError("killed mid-run")
    return {"condition": spec.condition, "seed": spec.seed, "value": len(spec.condition) * 10 + spec.seed}


def _launch(out: Path, **changes) -> Launch:
    return Launch(device=f"cpu|{out}", progress=False, **changes)


def test_folder_names_are_sanitised():
    assert RunSpec("baseline+cutmix", 2).folder("o") == Path("o/runs/baseline+cutmix/seed-2")
    assert RunSpec("entmax:1.3+reg4", 0).folder("o") == Path("o/runs/entmax_1.3+reg4/seed-0")


def test_records_in_order_and_finished_runs_reused(tmp_path):
    specs = [RunSpec(c, s) for c in ("ab", "abc") for s in (0, 1)]
    records = run_all(specs, _work, out=tmp_path, record_name="r.json", launch=_launch(tmp_path))
    assert [(r["condition"], r["seed"], r["value"]) for r in records] == [
        ("ab", 0, 20), ("ab", 1, 21), ("abc", 0, 30), ("abc", 1, 31)]
    assert json.loads((tmp_path / "runs/abc/seed-1/r.json").read_text())["value"] == 31
    again = run_all(specs, _work, out=tmp_path, record_name="r.json", launch=_launch(tmp_path))
    assert again == records
    assert all((spec.folder(tmp_path) / "calls").read_text() == "1" for spec in specs)


def test_a_failed_run_leaves_no_record_and_reruns(tmp_path):
    specs = [RunSpec("ok", 0), RunSpec("boom", 0)]
    with pytest.raises(RuntimeError, match="killed"):
        run_all(specs, _work, out=tmp_path, record_name="r.json", launch=_launch(tmp_path))
    assert (tmp_path / "runs/ok/seed-0/r.json").is_file()
    assert not (tmp_path / "runs/boom/seed-0/r.json").exists()
    with pytest.raises(RuntimeError):
        run_all(specs, _work, out=tmp_path, record_name="r.json", launch=_launch(tmp_path))
    assert (tmp_path / "runs/ok/seed-0/calls").read_text() == "1"  # only the failed run ran again
    assert (tmp_path / "runs/boom/seed-0/calls").read_text() == "2"


def test_side_by_side_on_each_device(tmp_path, monkeypatch):
    places = [f"cpu|{tmp_path}", f"cpu|{tmp_path}"]
    monkeypatch.setattr(runner, "devices", lambda device: places)  # stands in for two GPUs
    specs = [RunSpec("ab", 0), RunSpec("abc", 0), RunSpec("abcd", 0)]
    records = run_all(specs, _work, out=tmp_path, record_name="r.json", launch=_launch(tmp_path))
    assert [r["value"] for r in records] == [20, 30, 40]


def test_unknown_launcher():
    with pytest.raises(ValueError, match="launcher 'pbs' is unknown"):
        Launch(launcher="pbs")
