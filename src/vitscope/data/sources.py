"""One entry point for every dataset: ``load_dataset(name, root, split)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitscope.data.dataset import ImageDataset
from vitscope.data.synthetic import synthetic_scenes

DATASETS = ("synthetic",)
_SPLIT_ALIASES = {"train": "train", "eval": "eval", "test": "eval", "val": "eval", "validation": "eval"}


def canonical_split(split: str) -> str:
    """'train' or 'eval' from a split name (native names 'test' and 'val' mean 'eval')."""
    if split not in _SPLIT_ALIASES:
        raise ValueError(f"split {split!r} is unknown; use 'train' or 'eval' (or the native 'test' / 'val')")
    return _SPLIT_ALIASES[split]


def load_dataset(name: str, root: str | Path | None = None, split: str = "train", **options: Any) -> ImageDataset:
    """The labelled ``split`` of dataset ``name`` from ``root`` as an ``ImageDataset``."""
    split = canonical_split(split)
    if name == "synthetic":
        return synthetic_scenes(split, **options)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
