"""The registers study's ``results.json`` as a typed object (``StudyResults`` plus the measured ``models``).

Schema 2 adds the judged claims (``vitscope.claims.Judgement``, one per registry claim and family, R6/R7 one per
register pair) and the census's per-layer ``separate_mode`` rows. Files of schema 1 (written before the claims
registry) still read: their claims are judged on reading, from their rows; the claims that need the per-layer mode
test then read 'not testable' with the reason (measure again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vitscope.studies.registers.verdicts import judge_claims
from vitscope.studies.study_results import StudyResults

KIND = "registers-study"


@dataclass
class RegistersResults(StudyResults):
    """``models``: one record per measured model (label, entry, planted, training, tokens, thresholds, num_images,
    parameters), in measurement order."""

    SCHEMA_VERSION: ClassVar[int] = 2
    KIND: ClassVar[str] = KIND

    study: str = "registers"
    models: list[dict[str, Any]] = field(default_factory=list)

    @property
    def dataset(self) -> str:
        """The evaluation data's name, as provenance records it."""
        return str(self.provenance.get("dataset", ""))

    @classmethod
    def judged_from(cls, rows: list[dict[str, Any]], models: list[dict[str, Any]], **fields: Any) -> RegistersResults:
        """New results with every claim judged on ``rows`` and ``models`` (``verdicts.judge_claims``)."""
        results = cls(rows=rows, models=models, **fields)
        results.claims = judge_claims(rows, models, results.dataset)
        return results

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RegistersResults:
        """Results from their file's dict; a file written before the claims registry gets its claims judged now."""
        results = super().from_json(data)
        if not results.claims:
            results.claims = judge_claims(results.rows, results.models, results.dataset)
        return results
