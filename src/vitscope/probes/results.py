"""One result type for every probe, written as ``results.json`` (the shared schema) and ``results.csv``.

Rows are flat: ``{model, layer, layer_kind, group, with_cls, metric, value, n}`` (absent fields omitted). ``model``
is the probed model's label, the label with `` (random init)`` for the same architecture with random weights, or
``chance`` for the trivial predictor, so every number is read next to its floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitscope.atomic_io import write_csv, write_json

ROW_FIELDS = ("model", "layer", "layer_kind", "group", "with_cls", "metric", "value", "n")
RANDOM_SUFFIX = " (random init)"
CHANCE = "chance"


def row(**fields: Any) -> dict[str, Any]:
    """A results row with the shared field order; fields that are None are left out."""
    unknown = set(fields) - set(ROW_FIELDS)
    if unknown:
        raise ValueError(f"results rows have no fields {sorted(unknown)}; use {', '.join(ROW_FIELDS)}")
    return {name: fields[name] for name in ROW_FIELDS if fields.get(name) is not None}


@dataclass
class ProbeResult:
    """A probe's rows and the settings that produced them (``settings["model"]`` is the probed label), and the
    claims it judged (``claims``: ``vitscope.claims.Judgement.to_json()`` entries, written when there are any)."""

    kind: str
    rows: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)

    def value(self, layer: int | None = None, group: str | None = None, metric: str | None = None,
              model: str | None = None, **other: Any) -> float:
        """The one value matching the filters (``model`` defaults to the probed model's label)."""
        wanted = {"model": model or self.settings.get("model"), "layer": layer, "group": group, "metric": metric,
                  **other}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        found = [r for r in self.rows if all(r.get(k) == v for k, v in wanted.items())]
        if len(found) != 1:
            raise KeyError(f"{len(found)} rows match {wanted} (expected exactly one)")
        return found[0]["value"]

    def write(self, out: str | Path, provenance: dict[str, Any], stem: str = "results") -> dict[str, Path]:
        """``<stem>.json`` as ``{schema_version, kind, settings, rows, [claims,] provenance}`` and ``<stem>.csv``."""
        out = Path(out)
        payload = {"schema_version": provenance.get("schema_version", 1), "kind": self.kind,
                   "settings": self.settings, "rows": self.rows,
                   **({"claims": self.claims} if self.claims else {}), "provenance": provenance}
        columns = [name for name in ROW_FIELDS if any(name in r for r in self.rows)]
        table = [{name: r.get(name, "") for name in columns} for r in self.rows]
        return {"json": write_json(out / f"{stem}.json", payload), "csv": write_csv(out / f"{stem}.csv", table)}
