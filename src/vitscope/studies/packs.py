"""Train a study's unfinished (condition, seed) runs in packs before the runner measures them.

``train_in_packs`` groups the runs that still lack a finished training run into packs of ``pack`` runs
(``"auto"``: as many as the device's memory holds) and trains each pack with ``vitscope.train.packed.train``;
the study runner then finds every run trained and only measures it. Each member of a pack continues from its
own latest checkpoint, so a study resumed after a kill picks every run up where it stopped; runs are sorted
by progress so that runs of one pack finish at about the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from vitscope.provenance import resolve_device
from vitscope.run_folder import writer_lock
from vitscope.studies.runner import RunSpec
from vitscope.train import TrainConfig
from vitscope.train.checkpoint import latest_checkpoint
from vitscope.train.packed.train import auto_pack_size, train_packed


def check_pack(pack: int | str) -> int | str:
    """``pack`` as an int >= 1 or ``"auto"``; a ValueError naming the value otherwise."""
    if pack == "auto":
        return pack
    try:
        size = int(pack)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise ValueError(f"pack={pack!r} must be a number of runs >= 1 or 'auto' (pack by device memory)")
    return size


def _progress(cfg: TrainConfig) -> int:
    checkpoint = latest_checkpoint(cfg.out)
    return int(checkpoint.name.split("-")[1]) if checkpoint else 0


def train_in_packs(specs: Sequence[RunSpec], config: Callable[[RunSpec], TrainConfig], *, out: str | Path,
                   record_name: str, pack: int | str, device: str, progress: bool = True) -> None:
    """Train every spec without a record or finished run (``summary.json``) in packs of ``pack`` runs."""
    pack = check_pack(pack)
    todo = [config(spec) for spec in specs
            if not (spec.folder(out) / record_name).is_file() and not (spec.folder(out) / "summary.json").is_file()]
    if not todo or pack == 1:
        return
    todo.sort(key=_progress)
    with writer_lock(out, what="study folder"):
        size = auto_pack_size(todo[0], len(todo), resolve_device(device)) if pack == "auto" else pack
        for start in range(0, len(todo), size):
            group = todo[start: start + size]
            if progress:
                names = ", ".join(f"{c.protocol} seed {c.seed}" for c in group)
                print(f"[pack {start // size + 1}/{-(-len(todo) // size)}] {names}", flush=True)
            train_packed(group, resume=True)
