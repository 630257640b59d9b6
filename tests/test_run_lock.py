"""One writer per run folder, study folder and feature-cache entry: a second process is refused (or, for the
cache, waits), the refusal names the folder and the holder's pid, and a killed holder leaves no stale lock."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitscope.run_folder import FolderInUse, writer_lock
from vitscope.studies.runner import RunSpec, run_all
from vitscope.train import TrainConfig, train

RUN_FOLDER_PY = Path(__file__).resolve().parents[1] / "src" / "vitscope" / "run_folder.py"
TINY = {"model": "vit-micro", "model_options": {"depth": 1, "embed_dim": 16, "num_heads": 1},
        "dataset": "synthetic", "dataset_options": {"num_images": 64}, "eval_images": 32, "batch_size": 32,
        "warmup_epochs": 1, "epochs": 1, "progress": False, "device": "cpu"}

# a second process holding a lock, without importing torch: run_folder.py loaded by path (stdlib only)
HOLDER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("run_folder", sys.argv[1])
run_folder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_folder)
with run_folder.writer_lock(sys.argv[2], name=sys.argv[3]):
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
"""


def hold(folder: Path, seconds: float = 60, name: str = ".vitscope.lock") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(RUN_FOLDER_PY), str(folder), name, str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_of_a_run_folder_is_refused_naming_folder_and_pid(tmp_path):
    run = tmp_path / "run"
    holder = hold(run)
    try:
        cfg = TrainConfig.from_dict({**TINY, "out": str(run)})
        with pytest.raises(FolderInUse, match=rf"run folder {run} is in use .*pid {holder.pid}\b"):
            train(cfg)
        assert not (run / "config.json").exists() and not (run / "metrics.jsonl").exists()  # nothing written
        # the real entry point: `--resume` on a run that is still being written is refused in one line
        (run / "config.json").write_text(json.dumps({"config": cfg.to_dict()}))
        refused = subprocess.run([sys.executable, "-m", "vitscope.cli", "train", "--resume", str(run)],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2
        assert refused.stderr.strip().count("\n") == 0 and f"pid {holder.pid}" in refused.stderr
        assert not (run / "metrics.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with writer_lock(run):  # the kernel released the killed holder's lock: nothing stale is left
        pass
    assert train(TrainConfig.from_dict({**TINY, "out": str(run)}), resume=True)["steps"] == 2


def test_nested_blocks_of_one_process_share_the_lock(tmp_path):
    with writer_lock(tmp_path) as lock, writer_lock(tmp_path):
        assert lock.read_text().strip() == str(os.getpid())
    with writer_lock(tmp_path):  # released after the outer block
        pass


def test_second_study_on_a_study_folder_is_refused(tmp_path):
    holder = hold(tmp_path / "study")
    try:
        with pytest.raises(FolderInUse, match=rf"study folder .*study is in use .*pid {holder.pid}"):
            run_all([RunSpec("a", 0)], _record, out=tmp_path / "study", record_name="r.json")
    finally:
        holder.kill()
        holder.wait()
    assert run_all([RunSpec("a", 0)], _record, out=tmp_path / "study", record_name="r.json") == [{"seed": 0}]


def _record(spec: RunSpec, device: str) -> dict:
    return {"seed": spec.seed}


def test_a_feature_cache_entry_waits_for_its_writer(tmp_path):
    holder = hold(tmp_path, seconds=1.5, name=".entry.lock")
    start = time.perf_counter()
    with pytest.raises(FolderInUse, match="feature cache"):
        with writer_lock(tmp_path, "feature cache", name=".entry.lock"):
            pass
    with writer_lock(tmp_path, "feature cache", name=".entry.lock", wait=True):
        waited = time.perf_counter() - start
    assert waited > 1.0  # the holder keeps it 1.5 s after saying so
    holder.wait()


NO_FCNTL = """
import os, sys
sys.modules["fcntl"] = None  # as on Windows: no fcntl module
import vitscope
from vitscope.run_folder import writer_lock
with writer_lock(sys.argv[1]) as lock:
    assert lock.read_text().splitlines()[0] == str(os.getpid()), lock.read_text()
    print("held", flush=True)
"""


def test_import_and_writer_lock_without_fcntl(tmp_path):
    done = subprocess.run([sys.executable, "-c", NO_FCNTL, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "held", done.stderr[-2000:]
    with writer_lock(tmp_path / "run"):  # the soft lock's marker was released, not left stale
        pass


# ---- every command that writes an --out holds its lock (a second one on the same folder is refused at once) ----

PROBE = ["--device", "cpu", "--num-images", "4", "--batch-size", "4"]
WRITERS = {
    "probe pca": ["probe", "pca", *PROBE],
    "probe linear": ["probe", "linear", *PROBE],
    "explore": ["explore", *PROBE],
    "analyze norms": ["analyze", "norms", *PROBE],
    "analyze locality": ["analyze", "locality", *PROBE],
    "demo": ["demo", "sparse", "--device", "cpu"],
}


@pytest.mark.parametrize("command", WRITERS)
def test_a_second_command_on_one_out_is_refused_naming_the_holder(command, tmp_path, capsys, monkeypatch):
    """Two ``probe`` (or ``explore``) commands on one --out both exited 0 and the first one's results vanished."""
    from cli_refusals import refused

    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    holder = hold(out)
    try:
        line = refused([*WRITERS[command], "--out", str(out)], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert f"folder {out} is in use by another vitscope process (pid {holder.pid})" in line
    assert sorted(p.name for p in out.iterdir()) == [".vitscope.lock"]  # nothing of the refused command's


def test_an_unlocked_out_is_written_and_its_lock_released(tmp_path, capsys, monkeypatch):
    from vitscope.cli import main

    monkeypatch.setenv("VITSCOPE_CACHE", str(tmp_path / "cache"))
    assert main(["probe", "pca", *PROBE, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "pca.json").is_file()
    with writer_lock(tmp_path / "out"):  # released when the command ended
        pass


# ---- a writer killed mid-write leaves a temporary; the next writer of the folder removes it ----

KILLED_WRITER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("atomic_io", sys.argv[1])
atomic_io = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic_io)
with atomic_io.atomic_path(sys.argv[2]) as tmp:
    tmp.write_bytes(b"half a model")
    print(tmp.name, flush=True)
    time.sleep(60)
"""


def test_kill_9_during_the_model_write_leaves_no_temporary_for_good(tmp_path):
    """A kill -9 during the top-level model.safetensors write left ``.model.PID.tmp.safetensors`` for good; the next
    process that takes the folder's writer lock (train, resume, study, probe ...) removes it, and leaves a live
    writer's temporary alone."""
    run = tmp_path / "run"
    run.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(RUN_FOLDER_PY.with_name("atomic_io.py")),
                               str(run / "model.safetensors")], stdout=subprocess.PIPE, text=True)
    left = run / writer.stdout.readline().strip()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert left.name == f".model.{writer.pid}.tmp.safetensors" and left.is_file()
    live = run / f".summary.{os.getpid()}.tmp.json"  # this process is alive: its temporary stays
    live.write_text("{}")
    unrelated = run / ".notes.txt"
    unrelated.write_text("mine")
    with writer_lock(run):
        assert not left.exists()
    assert live.exists() and unrelated.exists() and not (run / "model.safetensors").exists()
