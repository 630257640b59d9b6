"""A study's ``results.json`` as a typed object: reports, the index page and the benchmarks read its attributes,
never guessed keys.

``StudyResults`` holds what every study writes (``{schema_version, study, kind, settings, rows, claims,
provenance}``, DESIGN.md's results schema plus the judged claims); each study extends it with what it adds (runs,
models, summaries) in ``studies/<study>/``. ``claims`` are ``vitscope.claims.Judgement`` objects, one per registry
claim the study judged, in the registry's order.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from vitscope.claims import Judgement

T = TypeVar("T", bound="StudyResults")


@dataclass
class StudyResults:
    """What every study's results hold: ``study`` (locality, sparse, registers), ``settings`` (the resolved study
    settings), ``rows`` (flat measurement rows, DESIGN.md's schema), ``claims`` (judged registry claims) and
    ``provenance``; ``schema_version`` of the file it was read from (``SCHEMA_VERSION`` when new)."""

    SCHEMA_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "study"

    study: str
    settings: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    claims: list[Judgement] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    schema_version: int = 0

    def __post_init__(self) -> None:
        self.schema_version = self.schema_version or self.SCHEMA_VERSION
        self.claims = [c if isinstance(c, Judgement) else Judgement.from_json(c) for c in self.claims]

    def judged(self) -> list[Judgement]:
        """The claims a rule judged (qualitative claims left out)."""
        return [c for c in self.claims if c.judged]

    def to_json(self) -> dict[str, Any]:
        """The results file's dict: every field, the claims as ``Judgement.to_json()``, and ``kind``."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["claims"] = [c.to_json() for c in self.claims]
        return {"schema_version": self.schema_version, "kind": self.KIND, **data}

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        """Results from their file's dict; keys a later version added are ignored, missing ones default. A file
        newer than this version reads is refused in one line."""
        version = int(data.get("schema_version", 1))
        if version > cls.SCHEMA_VERSION:
            raise ValueError(f"results of schema {version} are newer than this vitscope reads ({cls.SCHEMA_VERSION}); "
                             "upgrade vitscope")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def read(cls: type[T], folder: str | Path) -> T:
        """The results in ``folder/results.json``."""
        return cls.from_json(json.loads((Path(folder) / "results.json").read_text()))
