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

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

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
    """The pid that the holder left on the lock file's first line (a native lock's hint, a soft lock's marker)."""
    try:
        pid = lock.read_text().partition("\n")[0].strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


def _write_pid(fd: int) -> None:
    """Leave this process's pid in the natively locked file (through the lock's own descriptor: on Windows the
    locked byte refuses every other handle)."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".encode())


def _file_lock(lock: Path, wait: bool) -> filelock.FileLock:
    """A ``filelock.FileLock`` on ``lock``: ``fcntl.flock`` on Unix, ``LockFileEx`` on Windows, both released by the
    kernel when the holder dies; where neither exists, filelock's soft lock (a marker whose first line is the pid)."""
    native = sys.platform == "win32" or filelock.unix_has_fcntl
    return filelock.FileLock(lock, timeout=-1 if wait else 0, on_acquired=_write_pid if native else None)


@contextmanager
def writer_lock(folder: str | Path, what: str = "run folder", fix: str = "choose another --out", *,
                name: str = LOCK_FILE, wait: bool = False) -> Iterator[Path]:
    """Hold ``<folder>/<name>`` (an exclusive ``filelock.FileLock``) while writing to ``folder``.

    A second writer, in another process, gets a ``FolderInUse`` naming the folder and the holder's pid (with
    ``wait``, it waits for the holder instead). The kernel drops a native lock when the holder exits or is killed,
    so no lock is ever stale; the pid left in the file is only a hint. The lock file stays after release. Nested
    blocks of one process on one lock share it. Readers take no lock. Once held, the temporary files a killed
    writer left in ``folder`` are removed (``remove_dead_temporaries``).
    """
    folder = Path(folder).expanduser()
    lock = folder / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        key = folder.resolve() / name
    except OSError as err:
        raise _unwritable(what, folder, fix, err) from None
    if key in _held:
        _held[key] += 1
        try:
            yield lock
        finally:
            _held[key] -= 1
        return
    file_lock = _file_lock(lock, wait)
    try:
        file_lock.acquire()
    except filelock.Timeout:
        raise FolderInUse(f"{what} {folder} is in use by another vitscope process ({_holder(lock)}); wait for it "
                          f"to finish or stop it, or {fix}") from None
    except OSError as err:
        raise _unwritable(what, folder, fix, err) from None
    _held[key] = 1
    remove_dead_temporaries(folder)
    try:
        yield lock
    finally:
        del _held[key]
        file_lock.release()


def remove_dead_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries ``atomic_io.atomic_path`` left in ``folder`` when its writer was killed (kill -9 during
    a write of ``model.safetensors``, ``results.json`` ...), those of processes no longer alive; called by the
    writer that now holds the folder's lock."""
    from vitscope.atomic_io import TEMPORARY, remove_stale_temporaries

    return remove_stale_temporaries(folder, TEMPORARY)


def _unwritable(what: str, folder: Path, fix: str, err: OSError) -> PermissionError:
    return PermissionError(f"{what} {folder} cannot be written ({err.strerror or err}); make it a writable "
                           f"folder (chmod u+w {folder}) or {fix}")
