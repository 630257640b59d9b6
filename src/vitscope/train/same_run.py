"""Resuming a run folder only with the settings it was started with.

A run folder's ``config.json`` records the config it was started with. Resuming it (or reusing its finished
result) under another config would mix two runs and record the new settings for the old run, so
``check_same_run`` refuses, naming the changed setting, its old and new value, and the fix. Settings that do not
change what is trained (the device, the progress bar, where the folder is, data loading and logging) may differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitscope.train.config import TrainConfig

# settings that say how or where a run executes, not what it trains
RUNTIME_KEYS = frozenset({"device", "progress", "out", "data_workers", "stream", "memory_budget_gb", "download",
                          "log_every_steps", "checkpoint_every_steps", "keep_last", "keep_every", "compile"})
# the study options that set a config key, for the fix in the message
FLAGS = {"epochs": "--epochs", "batch_size": "--batch-size", "train_images": "--train-images",
         "eval_images": "--eval-images", "dataset": "--dataset", "data_dir": "--data-dir", "model": "--train-model",
         "seed": "--seeds"}


def _same(key: str, old: Any, new: Any) -> bool:
    if key == "data_dir" and old and new:  # one folder, named relatively or absolutely
        return Path(old).expanduser().resolve() == Path(new).expanduser().resolve()
    return old == new


def changed_settings(saved: dict[str, Any], cfg: TrainConfig) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) of every setting that differs; keys one side lacks (a config written by
    another vitscope version) are not compared."""
    new = json.loads(json.dumps(cfg.to_dict(), default=str))
    return [(key, saved[key], new[key]) for key in new
            if key in saved and key not in RUNTIME_KEYS and not _same(key, saved[key], new[key])]


def check_same_run(cfg: TrainConfig) -> None:
    """A ValueError when ``cfg.out`` holds a run started with other settings (see the module docstring);
    nothing when the folder holds no run yet."""
    record = Path(cfg.out) / "config.json"
    try:
        saved = json.loads(record.read_text()).get("config") or {}
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError):
        raise ValueError(f"run folder {cfg.out} has an unreadable {record.name}; move the folder away or pass "
                         "another --out") from None
    changes = changed_settings(saved, cfg)
    if changes:
        key, old, new = changes[0]
        flag = FLAGS.get(key)
        keep = f"rerun with {flag} {old}" if flag and old is not None else f"rerun with its {key} unchanged"
        more = f" (and {', '.join(k for k, _, _ in changes[1:])})" if len(changes) > 1 else ""
        raise ValueError(f"run folder {cfg.out} was started with {key}={old!r}, and this command asks for "
                         f"{key}={new!r}{more}; {keep} to continue it, or pass another --out for the new setting")
