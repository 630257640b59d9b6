"""The papers' claims as the seeds state them, one registry per study, and the one way they are judged.

``claim("L2")`` is one claim; ``claims_of("locality")`` a study's, in the seed's order. Every study, probe, report,
benchmark and ``docs/claims.md`` reads a paper's claim from here; nothing re-states a paper value by hand.
``vitscope.claims.judge`` judges a claim on evidence and gives a typed ``Judgement``.
"""

from __future__ import annotations

from vitscope.claims import locality, registers, sparse
from vitscope.claims.judgement import NOT_JUDGED, VERDICTS, Judgement, Reading
from vitscope.claims.registry import KINDS, STUDIES, Claim, ClaimTest, Paper
from vitscope.lazy_import import submodule_getattr

REGISTRY: dict[str, Claim] = {c.id: c for c in (*locality.CLAIMS, *sparse.CLAIMS, *registers.CLAIMS)}


def claim(claim_id: str) -> Claim:
    """The registry's claim ``claim_id`` ('L2', 'S3', 'R8-global' ...); a KeyError lists the known ids."""
    try:
        return REGISTRY[claim_id]
    except KeyError:
        raise KeyError(f"no claim {claim_id!r} in the registry; known: {', '.join(REGISTRY)}") from None


def claims_of(study: str) -> tuple[Claim, ...]:
    """A study's claims in the seed's order."""
    if study not in STUDIES:
        raise ValueError(f"study {study!r} is unknown; use one of {', '.join(STUDIES)}")
    return tuple(c for c in REGISTRY.values() if c.study == study)


__all__ = ["KINDS", "NOT_JUDGED", "REGISTRY", "STUDIES", "VERDICTS", "Claim", "ClaimTest", "Judgement", "Paper",
           "Reading", "claim", "claims_of"]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
