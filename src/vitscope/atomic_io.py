"""Writing files atomically: a temporary file beside the target, then a rename (JSON, CSV, bytes, any writer)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TEMPORARY = r"\..+\.(?P<pid>\d+)\.tmp(\.[^.]+)?"  # atomic_path's temporaries: .STEM.PID.tmp[.SUFFIX]


def temporary_path(path: str | Path) -> Path:
    """The temporary file ``atomic_path`` writes for ``path``: ``.STEM.PID.tmp.SUFFIX`` beside it (``TEMPORARY``)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix) for the caller to write; when the block ends without an
    error it is flushed to disk and renamed over ``path``, so readers see the old file or the whole new one,
    never a part. After an error the temporary file is removed and ``path`` is untouched (an OSError that names no
    file, as a full disk's from json or numpy writers, is given ``path`` as its filename). A writer killed inside the
    block leaves its temporary; ``run_folder.writer_lock`` removes those of dead processes.

        with atomic_path(out / "model.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.filename is None or str(err.filename) == str(tmp):  # the writers name no file, or the temporary
            err.filename = str(path)  # the output that was not written, for the one-line message
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: str | Path, payload: Mapping[str, Any]) -> Path:
    """JSON with NaN and infinities written as null (valid JSON for every reader)."""
    return atomic_write_bytes(path, (json.dumps(_json_safe(payload), indent=2) + "\n").encode())


def write_csv(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """CSV with a header from the first row's keys."""
    rows = list(rows)
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return atomic_write_bytes(path, buffer.getvalue().encode())


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists on this machine (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(folder: str | Path, pattern: str) -> list[Path]:
    """Remove the temporary files or folders in ``folder`` whose names match ``pattern`` (a regex whose group
    ``pid`` is the writer's process id) and whose writer is no longer alive: what a killed writer left behind.
    Returns what was removed; a folder that cannot be listed or an entry that cannot be removed is left alone."""
    import re
    import shutil

    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = re.fullmatch(pattern, entry.name)
        if match is None or pid_alive(int(match["pid"])):
            continue
        try:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed
