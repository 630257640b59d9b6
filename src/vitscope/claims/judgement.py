"""A claim's verdict as a typed object: what was compared, the estimate and its interval, the verdict and why, how
the effect compares in size with the paper's, and what model, data and sample it holds for.

Studies and probes write ``Judgement.to_json()`` into their ``results.json`` (a ``claims`` list); reports, the index
page, ``docs/claims.md`` and the benchmarks read them back with ``Judgement.from_json`` and use attributes, never
guessed keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
NOT_JUDGED = "not judged"  # a qualitative claim, shown with what vitscope offers for it
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable", NOT_JUDGED)


@dataclass
class Reading:
    """The same claim under another reading the seed leaves open (e.g. MAD with CLS counted at distance 0, or
    early layers = layers 1-2): its estimate, interval and verdict by the same rule."""

    name: str
    difference: float | None
    ci95_low: float | None
    ci95_high: float | None
    verdict: str
    reason: str = ""


@dataclass
class Judgement:
    """One claim judged on one body of evidence.

    - ``claim_id``, ``study``, ``statement``, ``kind``: from the registry (``vitscope.claims``);
    - ``verdict`` (one of ``VERDICTS``) and ``reason`` in words;
    - ``a``, ``b``: what was compared (conditions, token groups, layers; a - b is ``difference``);
    - ``difference`` with its interval [``ci95_low``, ``ci95_high``] (the 90 % TOST interval for an equivalence,
      said in ``method``), ``n_a``/``n_b`` values per side counted in ``unit`` (seeds, images);
    - ``power``: what these values can detect; ``paper``: the paper's value and where it was measured;
      ``paper_effect``: its size in the measure's unit; ``size``: the measured effect beside the paper's, in words;
    - ``scope``: the model, data and sample the verdict holds for, and how they differ from the paper's;
    - ``layer``, ``family``: where a per-layer or per-family claim was judged;
    - ``readings``: the claim under the other readings the seed leaves open; ``readings_note``: one sentence when
      they disagree with the verdict;
    - ``details``: what the kind of test adds (a separation's pairs, an equivalence's p-values, a census's models);
    - ``values_a``/``values_b``: the values compared; ``rows``: the result rows they came from (probes).
    """

    claim_id: str
    study: str
    statement: str
    kind: str
    verdict: str
    reason: str
    measure: str = ""
    a: str = ""
    b: str = ""
    difference: float | None = None
    ci95_low: float | None = None
    ci95_high: float | None = None
    method: str = ""
    n_a: int = 0
    n_b: int = 0
    unit: str = "seeds"
    power: str = ""
    paper: str = ""
    paper_effect: float | None = None
    size: str = ""
    scope: str = ""
    layer: int | None = None
    family: str | None = None
    readings: list[Reading] = field(default_factory=list)
    readings_note: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    values_a: list[float] = field(default_factory=list)
    values_b: list[float] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} of claim {self.claim_id} is not one of {', '.join(VERDICTS)}")

    @property
    def judged(self) -> bool:
        """Whether a rule gave the verdict (not a qualitative claim)."""
        return self.verdict != NOT_JUDGED

    def interval_text(self) -> str:
        """'+0.011 (95 % interval -0.036 to +0.057)', or the estimate alone, or '' without one."""
        if self.difference is None or _missing(self.difference):
            return ""
        if self.ci95_low is None or _missing(self.ci95_low):
            return f"{self.difference:+.3g}"
        level = "90 %" if self.kind == "equivalence" else "95 %"
        return f"{self.difference:+.3g} ({level} interval {self.ci95_low:+.3g} to {self.ci95_high:+.3g})"

    def sentence(self) -> str:
        """The report's one sentence: the verdict, the estimate and interval, the size beside the paper's, why."""
        parts = [p for p in (self.interval_text(), self.size) if p]
        found = f" {'; '.join(parts)}." if parts else ""
        return f"{self.verdict.capitalize()}:{found} {self.reason}".strip()

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (NaN as None), with the schema version."""
        return {"schema_version": SCHEMA_VERSION, **_clean(dataclasses.asdict(self))}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Judgement:
        """A Judgement from ``to_json``'s dict; unknown keys (a later schema's) are ignored, missing ones default."""
        version = int(data.get("schema_version", SCHEMA_VERSION))
        if version > SCHEMA_VERSION:
            raise ValueError(f"a claims entry of schema {version} is newer than this vitscope reads "
                             f"({SCHEMA_VERSION}); upgrade vitscope")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["readings"] = [Reading(**r) for r in values.get("readings") or []]
        return cls(**values)


def _missing(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value
