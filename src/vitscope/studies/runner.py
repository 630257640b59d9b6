"""One runner for every study's (condition, seed) runs: resumable, placed on devices, or launched as jobs.

A study describes its runs as ``RunSpec(condition, seed)`` values and gives a picklable
``work(spec, device) -> dict`` (a module-level function, or a ``functools.partial`` of one) that trains or
loads the run in ``spec.folder(out)`` and measures it, returning a JSON-able record. The runner:

- reuses finished work: a run whose record file (``<run folder>/<record_name>``) exists is read back, not
  rerun; a record is written atomically when its work returns, so a killed study resumes on rerun where it
  stopped (the work resumes its own training from the run folder's checkpoints);
- places runs: on one device in order, or, with ``device="auto"`` and several GPUs, one run per GPU side by
  side (spawned processes);
- or launches each unfinished run as a submitit job (``launcher="slurm"``; ``"submitit-local"`` runs the
  jobs on this machine, for tests).

Example::

    specs = [RunSpec(c, s) for c in ("softmax", "entmax15") for s in (0, 1)]
    records = run_all(specs, functools.partial(train_and_probe, study), out=study.out,
                      record_name="sparse.json", device=study.device, launcher=study.launcher)
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from vitscope.atomic_io import write_json
from vitscope.run_folder import writer_lock

LAUNCHERS = ("local", "slurm", "submitit-local")
Work = Callable[["RunSpec", str], dict[str, Any]]


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: a condition name (any text; folder names are sanitised) and a seed."""

    condition: str
    seed: int

    def folder(self, out: str | Path) -> Path:
        """``<out>/runs/<condition>/seed-<seed>``; characters other than letters, digits and ``.+-_`` become ``_``
        (``entmax:1.3+reg4`` -> ``entmax_1.3+reg4``)."""
        return Path(out) / "runs" / re.sub(r"[^A-Za-z0-9.+\-_]", "_", self.condition) / f"seed-{self.seed}"


@dataclass
class Launch:
    """Where and how runs execute: ``device`` (auto, cpu, cuda, cuda:N), ``launcher`` (local, slurm,
    submitit-local) and submitit parameters for slurm (e.g. ``{"slurm_partition": "gpu"}``)."""

    device: str = "auto"
    launcher: str = "local"
    slurm: dict[str, Any] = field(default_factory=dict)
    name: str = "vitscope"
    progress: bool = True

    def __post_init__(self) -> None:
        check_launcher(self.launcher)


def check_launcher(launcher: str) -> None:
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r} is unknown; use local or slurm")


def require_slurm() -> None:
    """A ValueError naming the flag and the fix on a machine without SLURM (no ``sbatch`` on the PATH)."""
    if shutil.which("sbatch") is None:
        raise ValueError("--launcher slurm needs a SLURM cluster, and sbatch is not on this machine's PATH; run the "
                         "study from a SLURM login node, or use --launcher local")


def devices(device: str) -> list[str]:
    """The devices runs go to side by side: every visible GPU for ``auto`` when there are several, else
    ``[device]``."""
    if device == "auto" and torch.cuda.device_count() > 1:
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [device]


def _run_one(work: Work, spec: RunSpec, device: str, record: Path) -> dict[str, Any]:
    """Run (or reuse) one spec and write its record atomically."""
    if record.is_file():
        return json.loads(record.read_text())
    result = work(spec, device)
    write_json(record, result)
    return result


def run_all(specs: Sequence[RunSpec], work: Work, *, out: str | Path, record_name: str,
            launch: Launch | None = None) -> list[dict[str, Any]]:
    """Every spec's record, in the order of ``specs``; see the module docstring. The study folder ``out`` is
    locked while the runs go (one study writes to a folder at a time)."""
    with writer_lock(out, what="study folder"):
        return _run_all(specs, work, out=out, record_name=record_name, launch=launch or Launch())


def _run_all(specs: Sequence[RunSpec], work: Work, *, out: str | Path, record_name: str,
             launch: Launch) -> list[dict[str, Any]]:
    records = {spec: spec.folder(out) / record_name for spec in specs}
    todo = [spec for spec in specs if not records[spec].is_file()]
    done: dict[RunSpec, dict[str, Any]] = {}
    if todo and launch.launcher != "local":
        done = dict(zip(todo, _submit(todo, work, records, out, launch), strict=True))
    elif len(todo) > 1 and len(devices(launch.device)) > 1:  # one run per device, side by side
        places = devices(launch.device)
        with ProcessPoolExecutor(len(places), mp_context=get_context("spawn")) as pool:
            futures = {spec: pool.submit(_run_one, work, spec, places[i % len(places)], records[spec])
                       for i, spec in enumerate(todo)}
            done = {spec: future.result() for spec, future in futures.items()}
    else:
        for k, spec in enumerate(todo, 1):
            if launch.progress:
                print(f"[{k}/{len(todo)}] {spec.condition} seed {spec.seed}", flush=True)
            done[spec] = _run_one(work, spec, devices(launch.device)[0], records[spec])
    return [done[spec] if spec in done else json.loads(records[spec].read_text()) for spec in specs]


def _submit(specs: list[RunSpec], work: Work, records: dict[RunSpec, Path], out: str | Path,
            launch: Launch) -> list[dict[str, Any]]:
    """One submitit job per spec; each is resumable and returns its record."""
    cluster = "local" if launch.launcher == "submitit-local" else "slurm"
    if cluster == "slurm":
        require_slurm()
    try:
        import submitit
    except ImportError:
        raise ValueError("--launcher slurm needs submitit: pip install 'vitscope[slurm]'") from None
    executor = submitit.AutoExecutor(folder=str(Path(out) / "submitit"), cluster=cluster)
    defaults = {"timeout_min": 24 * 60, "gpus_per_node": 1, "cpus_per_task": 8, "name": launch.name}
    executor.update_parameters(**(defaults | launch.slurm if cluster == "slurm" else {"timeout_min": 60}))
    with executor.batch():
        jobs = [executor.submit(_run_one, work, spec, launch.device, records[spec]) for spec in specs]
    return [job.result() for job in jobs]
