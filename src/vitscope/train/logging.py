"""Run metrics as JSON lines and TensorBoard event files (written by the main rank only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitscope.atomic_io import atomic_write_bytes


class MetricsLog:
    """Appends one JSON object per record to ``metrics.jsonl`` and mirrors scalars to TensorBoard.

    On resume, records past the checkpoint's step are dropped so the log matches the restored state.
    """

    def __init__(self, run_dir: Path, resume_step: int | None, enabled: bool = True):
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._writer = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            atomic_write_bytes(self.path, ("\n".join(kept) + "\n" if kept else "").encode())
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)
        except ImportError:  # tensorboard is a dependency, but keep training if an install lacks it
            self._writer = None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._writer is not None:
            step = record["step"]
            for key, value in record.items():
                if key not in ("step", "epoch", "kind") and isinstance(value, int | float):
                    self._writer.add_scalar(f"{record.get('kind', 'train')}/{key}", value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
