"""The layout of a vitscope run folder; this module is its only owner.

    <run>/model.safetensors          the model to evaluate (weights + vitscope config; for DINO the teacher
                                     backbone), refreshed at every checkpoint and at the end
    <run>/summary.json               written when training finished
    <run>/checkpoints/step-<N>/      the trainer's resumable state: model.safetensors and state.pt
    <run>/checkpoints/step-<N>/SHA256SUMS   their sha256 sums, written last and verified before a resume
    <run>/checkpoints/LATEST         the name of the newest complete checkpoint folder
    <run>/.vitscope.lock             the writer's lock (``writer_lock``; study folders have one too)

``vitscope.models.load(RUN_DIR)`` reads only the top level; the trainer reads and writes ``checkpoints/``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL_FILE = "model.safetensors"
SUMMARY_FILE = "summary.json"
CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
STATE_FILE = "state.pt"
CHECKSUMS = "SHA256SUMS"


def model_file(run_dir: str | Path) -> Path:
    """The run's model to evaluate."""
    return Path(run_dir) / MODEL_FILE


def summary_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / SUMMARY_FILE


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def latest_pointer(run_dir: str | Path) -> Path:
    """The file that names the newest complete checkpoint folder."""
    return checkpoints_dir(run_dir) / LATEST


LOCK_FILE = ".vitscope.lock"
_held: dict[Path, int] = {}  # folder -> how many nested writer_lock blocks of this process hold it


class FolderInUse(RuntimeError):
    """Another process is writing to the folder (it holds the folder's lock)."""


def is_empty_but_lock(folder: str | Path) -> bool:
    """True when ``folder`` holds nothing but a lock file (a writer stopped before writing anything)."""
    return Path(folder).is_dir() and all(p.name == LOCK_FILE for p in Path(folder).iterdir())


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


@contextmanager
def writer_lock(folder: str | Path, what: str = "run folder", fix: str = "choose another --out", *,
                name: str = LOCK_FILE, wait: bool = False) -> Iterator[Path]:
    """Hold ``<folder>/<name>`` (an exclusive ``fcntl.flock``) while writing to ``folder``.

    A second writer, in another process, gets a ``FolderInUse`` naming the folder and the holder's pid (with
    ``wait``, it waits for the holder instead). The kernel drops the lock when the holder exits or is killed,
    so no lock is ever stale; the pid left in the file is only a hint. Nested blocks of one process on one lock
    share it. Readers take no lock.
    """
    folder = Path(folder).expanduser()
    lock = folder / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        key = folder.resolve() / name
        fd = None if key in _held else os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise PermissionError(f"{what} {folder} cannot be written ({err.strerror or err}); make it a writable "
                              f"folder (chmod u+w {folder}) or {fix}") from None
    if fd is None:
        _held[key] += 1
        try:
            yield lock
        finally:
            _held[key] -= 1
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise FolderInUse(f"{what} {folder} is in use by another vitscope process ({_holder(lock)}); wait for it "
                              f"to finish or stop it, or {fix}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _held[key] = 1
        try:
            yield lock
        finally:
            del _held[key]
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
