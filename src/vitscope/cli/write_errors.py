"""The one line for a write that failed underneath a command: a full disk, a read-only ``VITSCOPE_CACHE``.

The writers (json, safetensors, ``torch.save``, numpy) report a full disk as ``[Errno 28]`` without a path, or,
for ``torch.save``, as ``[enforce fail at inline_container.cc:...]``; ``write_failure_line`` turns either into a
line that names the folder, says the disk is full and how to go on. The CLI's error handling is its only caller.
"""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

from vitscope.cache_dir import cache_root

# what torch's zip writer raises when a write fails (a full disk, or a file system that went away)
TORCH_WRITER_FAILURE = ("inline_container.cc", "PytorchStreamWriter failed", "file write failed")
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors it was raised from or during."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)  # `from None`: its own line
    return chain


def _folder(err: BaseException, args: argparse.Namespace) -> str:
    """The folder the failed write went to: the error's file's folder, else the command's output folder."""
    name = getattr(err, "filename", None)
    if name:
        path = Path(name)
        return str(path if path.is_dir() else path.parent)
    out = getattr(args, "out", None) or getattr(args, "resume", None)
    return str(out) if out else "the output folder"


def _not_written(err: BaseException) -> str:
    """Which outputs a failed write left out: the file it was writing (and those after it), and the files this
    command wrote into the same folder before it; empty when the error names no file."""
    from vitscope.cli.out_folders import created_folders

    name = getattr(err, "filename", None)
    if not name or Path(name).is_dir():
        return ""
    failed = Path(name)
    try:
        written = sorted((p for p in failed.parent.iterdir() if p.is_file() and not p.name.startswith(".")
                          and p.stat().st_mtime >= created_folders.started and p.name != failed.name),
                         key=lambda p: p.stat().st_mtime)
    except OSError:
        written = []
    before = f" (written before it: {', '.join(p.name for p in written)})" if written else " (nothing was written)"
    return f": {failed.name} and the outputs after it were not written{before}"


def _under(path: str, root: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(root.resolve())
    except (OSError, ValueError):
        return False


def write_failure_line(err: BaseException, args: argparse.Namespace) -> str | None:
    """The line to print for a write that failed for want of room or of permission in vitscope's cache, or None
    when ``err`` is not one (the caller prints its own line)."""
    for cause in _chain(err):
        full = isinstance(cause, OSError) and cause.errno == errno.ENOSPC
        torch_writer = isinstance(cause, RuntimeError) and any(s in str(cause) for s in TORCH_WRITER_FAILURE)
        if full or torch_writer:
            folder = _folder(cause, args)
            why = "no space left on device" if full else "torch's file writer failed: the disk is full or gone"
            training = getattr(args, "command", None) == "train"
            then = (f"; then continue the run with `vitscope train --resume {args.resume or args.out}`"
                    if training and (args.resume or args.out) else "")
            lost = "" if training else _not_written(cause)
            return (f"the disk holding {folder} is full ({why}){lost}; free space or pass an --out on a disk with "
                    f"room{then or ', then run the command again'}")
        name = getattr(cause, "filename", None)
        if isinstance(cause, OSError) and cause.errno in READ_ONLY and name and _under(name, cache_root()):
            return (f"VITSCOPE_CACHE {cache_root()} cannot be written ({cause.strerror}: {name}); set VITSCOPE_CACHE "
                    "to a writable folder, or pass --no-cache (probe commands) to keep features in memory")
        run = getattr(args, "resume", None) or getattr(args, "out", None)
        if (isinstance(cause, OSError) and cause.errno in READ_ONLY and name and run
                and getattr(args, "command", None) == "train" and _under(name, Path(run))):
            return (f"run folder {run} cannot be written ({cause.strerror}: {name}); make it writable (chmod -R u+w "
                    f"{run}) and continue with `vitscope train --resume {run}`")
    return None
