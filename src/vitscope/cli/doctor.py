"""``vitscope doctor``: what this installation runs on (versions, device, normaliser path, caches, compiler).

Exit code 1 when something is wrong that the user can fix: the native CPU kernels do not load although a C++
compiler is present (for example a wheel without the kernels' headers). All probing of the attention fast
paths is in ``normaliser_path`` so that it follows that API in one place.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import warnings
from pathlib import Path
from typing import Any

from vitscope.cli.options import add_shared

PACKAGES = ("vitscope", "torch", "torchvision", "timm", "numpy", "safetensors", "entmax")


def register(commands) -> None:
    doctor = commands.add_parser("doctor", help="versions, device, normaliser path, caches and compiler; "
                                                "exit 1 when native kernels fail although a compiler exists")
    add_shared(doctor, device="auto")
    doctor.set_defaults(handler=run)


def versions() -> dict[str, str]:
    import vitscope

    found = {"python": platform.python_version(),
             "vitscope": f"{vitscope.__version__} ({Path(vitscope.__file__).parent})"}
    for name in PACKAGES[1:]:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def compiler() -> dict[str, Any]:
    """The C++ compiler the native kernels would use, and its version line (None when there is none)."""
    from vitscope.attention import native

    try:
        path = native.find_compiler()
    except RuntimeError as err:
        return {"path": None, "version": None, "note": str(err)}
    try:
        line = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as err:
        return {"path": path, "version": None, "note": f"cannot run it: {err}"}
    return {"path": path, "version": line[0] if line else "?"}


def normaliser_path(device) -> dict[str, Any]:
    """Which implementation the sparse normalisers (sparsemax, entmax) use on ``device``, and why: the fast paths
    in force (``vitscope.attention.paths``: ``VITSCOPE_FUSED``, ``VITSCOPE_NATIVE``, ``fast_paths(...)``) and
    whether the process's native kernels (``native.kernels()``) load."""
    from vitscope.attention import native
    from vitscope.attention.paths import current

    kernels = native.kernels()
    files = [Path(p) for p in (*kernels.sources, *native.HEADERS)]
    listed = ", ".join(f"{p.name}{'' if p.is_file() else ' (MISSING)'}" for p in files)
    info: dict[str, Any] = {"kernel sources": listed, "kernel folder": str(native.HERE), "native": "off",
                            "native why": ""}
    paths = current()
    if not paths.native and not paths.compiled:
        info |= {"path": "eager PyTorch solvers", "why": "VITSCOPE_FUSED=0 (or fast_paths) turns every fast path off"}
        return info
    if not paths.native:
        info["native why"] = "VITSCOPE_NATIVE=0 (or fast_paths(native=False))"
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the reason is reported below
            library = kernels.library()
        if library is not None:
            info |= {"native": "loaded", "native why": f"built in {native.cache_dir()}"}
        else:
            info |= {"native": "failed", "native why": kernels.error or "the build failed"}
    if device.type == "cpu" and info["native"] == "loaded":
        info |= {"path": "native CPU kernels", "why": "CPU device and the kernels built"}
    elif device.type == "cpu":
        info |= {"path": "compiled PyTorch kernels (torch.compile, C++), eager for small tensors",
                 "why": "CPU device without native kernels"}
    else:
        info |= {"path": "compiled PyTorch kernels (torch.compile, Triton)", "why": f"{device.type} device"}
    return info


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def caches() -> dict[str, str]:
    from vitscope.cache_dir import cache_root

    root = cache_root()
    found = {"root": f"{root} ({'VITSCOPE_CACHE' if os.environ.get('VITSCOPE_CACHE') else 'default'})"}
    for name in ("datasets", "native"):
        folder = root / name
        found[name] = f"{folder}: {folder_size(folder) / 2**20:.2f} MiB" if folder.is_dir() else f"{folder}: empty"
    return found


def run(args: argparse.Namespace) -> int:
    import torch

    from vitscope.provenance import device_description, resolve_device

    device = resolve_device(args.device)
    sections = {
        "versions": versions(),
        "device": {"using": device_description(device), "cuda available": str(torch.cuda.is_available()),
                   "gpus": str(torch.cuda.device_count()), "cpu threads": str(torch.get_num_threads())},
        "compiler": compiler(),
        "normalisers": normaliser_path(device),
        "caches": caches(),
    }
    for title, values in sections.items():
        print(f"{title}:")
        for key, value in values.items():
            if value not in (None, ""):
                print(f"  {key:<16} {value}")
    problems = []
    if sections["compiler"]["path"] and sections["normalisers"]["native"] == "failed":
        problems.append("native CPU kernels failed to load although a C++ compiler is present: "
                        + sections["normalisers"]["native why"])
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0
