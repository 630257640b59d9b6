"""Output folders: checked before any work, created once the options are, held by one writer at a time
(``locked_out``), and removed again when a command fails before writing anything into them (``created_folders``)."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path


def check_output_dir(path: str | Path) -> Path:
    """``path`` if it is a writable folder or could be created as one (nothing is created: a refused command
    leaves no folder behind), else a ValueError naming it and the fix."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is an existing file, not a folder; pass a folder path "
                         "(it is created if missing)")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {folder} cannot be created ({existing} is a file, not a folder); pass a folder you "
                         "can write to")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == folder else f"cannot be created ({existing} is not writable)"
        raise ValueError(f"--out {folder} {what}; pass a folder you can write to")
    return folder


class CreatedFolders:
    """The output folders this command created (the outermost new one of each path), so that a command that
    fails before writing anything there removes them again: a refused command leaves no folder behind. The CLI
    clears it before each command (``begin``) and calls ``remove_unused`` when the command fails."""

    def __init__(self) -> None:
        self.folders: list[Path] = []
        self.started = time.time()  # when the command began (seconds since the epoch): what it wrote is newer

    def begin(self) -> None:
        self.folders = []
        self.started = time.time()

    def note(self, folder: Path) -> None:
        """Record ``folder``'s outermost ancestor that does not exist yet (call before creating it)."""
        missing = [p for p in (folder, *folder.absolute().parents) if not p.exists()]
        if missing:
            self.folders.append(missing[-1])

    def remove_unused(self) -> None:
        """Remove each recorded folder that holds nothing but lock files and empty folders (nothing written)."""
        for folder in self.folders:
            if folder.is_dir() and all(p.is_dir() or _is_lock_file(p) for p in folder.rglob("*")):
                shutil.rmtree(folder, ignore_errors=True)
        self.folders = []


def _is_lock_file(path: Path) -> bool:
    from vitscope.run_folder import LOCK_FILE

    return path.name == LOCK_FILE or (path.name.startswith(".") and path.name.endswith(".lock"))


created_folders = CreatedFolders()


def output_dir(path: str | Path) -> Path:
    """``path`` as a folder that exists and can be written (created here, once the command's options are
    checked, and noted in ``created_folders``), else a ValueError naming it and the fix."""
    folder = check_output_dir(path)
    created_folders.note(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {folder} cannot be created ({err.strerror or err}); pass a folder you can "
                         "write to") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {folder} is not writable; pass a folder you can write to")
    return folder


def print_files(files: dict[str, Path]) -> None:
    for kind, path in files.items():
        print(f"{kind:>10}: {path}")


def locked_out(handler: Callable[[argparse.Namespace], int], default_out: str) -> Callable[[argparse.Namespace], int]:
    """``handler`` run while it holds its output folder's writer lock (``run_folder.writer_lock``; ``--out``, else
    ``default_out``), taken before anything loads: a second command on the same folder is refused at once in one
    line naming the holder's pid, instead of both writing there and the first one's results vanishing."""
    from vitscope.run_folder import writer_lock

    def run(args: argparse.Namespace) -> int:
        folder = check_output_dir(args.out or default_out)
        created_folders.note(folder)  # a refused command removes it again (it holds only the lock)
        with writer_lock(folder, "output folder"):
            return handler(args)

    run.__doc__ = handler.__doc__
    return run
