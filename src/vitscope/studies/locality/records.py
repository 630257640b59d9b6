"""One trained and measured run of the locality study, as a typed record (``locality.json`` in its run folder, and
each entry of ``results.json``'s ``runs``).

Per layer and head (lists of lists, (layers, heads)), over the evaluation images:

- ``mad``: MAD with prefix tokens (CLS) dropped and each row renormalised over patch keys (the study's stated
  reading; docs/definitions.md);
- ``mad_cls_at_zero``: MAD of the raw patch mass, i.e. with the row's mass on CLS counted at distance 0 (the other
  reading the seed leaves open); None for a run measured before vitscope kept it;
- ``entropy``: normalised entropy of the renormalised patch rows; ``skipped``: (image, head) entries without
  patch mass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vitscope.provenance import SCHEMA_VERSION


@dataclass
class LocalityRun:
    """A run's condition, seed, top-1 ``accuracy`` (None without a head for the dataset's classes), the per-head
    measures above, the geometry they were measured on (``grid_size`` (rows, cols), ``num_prefix_tokens``,
    ``patch_size``), the evaluation sample and the run's training config."""

    condition: str
    seed: int
    accuracy: float | None = None
    layers: list[int] = field(default_factory=list)
    mad: list[list[float]] = field(default_factory=list)
    entropy: list[list[float]] = field(default_factory=list)
    mad_cls_at_zero: list[list[float]] | None = None
    skipped: list[list[float]] = field(default_factory=list)
    num_images: int = 0
    eval_subset: dict[str, Any] | None = None
    num_prefix_tokens: int = 1
    grid_size: list[int] | None = None
    patch_size: int | None = None
    train_top1_eval: float | None = None
    train_images: int | None = None
    train_images_per_epoch: int | None = None
    train_config: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.layers and self.mad:
            self.layers = list(range(len(self.mad)))

    @property
    def num_layers(self) -> int:
        return len(self.mad)

    def measure(self, name: str) -> list[list[float]] | None:
        """A per-head measure by name ('mad', 'mad_cls_at_zero', 'entropy'); None when this run lacks it."""
        if name not in ("mad", "mad_cls_at_zero", "entropy"):
            raise ValueError(f"measure {name!r} is not one of mad, mad_cls_at_zero, entropy")
        return getattr(self, name) or None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | LocalityRun) -> LocalityRun:
        """A run from its record (keys a later version added are ignored, missing ones default)."""
        if isinstance(data, LocalityRun):
            return data
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def as_runs(records: list[dict[str, Any]] | list[LocalityRun]) -> list[LocalityRun]:
    """Records (dicts as stored, or runs) as ``LocalityRun``s."""
    return [LocalityRun.from_json(r) for r in records]
