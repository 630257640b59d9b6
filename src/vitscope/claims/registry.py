"""The claims registry's types: a paper's claim as its seed states it, the value it reports, and the kind of test
that judges it (one registry per study: ``claims.locality``, ``claims.sparse``, ``claims.registers``).

A claim is data, never prose re-stated by hand elsewhere: studies, probes, reports, benchmarks and
``docs/claims.md`` read it from here (``vitscope.claims.claim(id)``, ``claims_of(study)``).

Kinds of test (``ClaimTest.kind``), each judged by ``vitscope.claims.judge``:

- ``difference``: a mean difference (a - b) with the paper's ``effect``; reproduced when the 95 % interval excludes
  zero in the paper's direction and the estimate reaches half the effect (``vitscope.stats.compare``);
- ``separation``: every group-a condition at or below ``upper`` and every group-b condition at or above ``lower``
  in the paper; judged on every (a, b) pair of conditions: reproduced when each pair separates (b - a, interval
  above zero) by at least half the paper's gap (``lower - upper``);
- ``direction``: the sign only (the paper gives no size): reproduced when the interval excludes zero that way;
- ``equivalence``: no effect beyond ``margin`` (two one-sided tests, ``vitscope.stats.equivalence``);
- ``census``: whether models (or runs) of a kind have a property at all (``expect``: True, some do, or with
  ``every`` each one does; False, none does), e.g. a separate high-norm mode, or exact zeros in the attention: a
  property that a model either shows or not, judged model by model, not a statistic over seeds;
- ``qualitative``: a figure, a hypothesis or a scope statement; shown with what vitscope offers, never judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STUDIES = ("locality", "sparse", "registers")
KINDS = ("difference", "separation", "direction", "equivalence", "census", "qualitative")
FAMILIES = ("plain", "dino", "swin", "pvt")  # architecture families a registers claim may be stated for


@dataclass(frozen=True)
class ClaimTest:
    """How a claim is judged. ``effect``: the paper's a - b (difference); ``sign``: +1 or -1, the paper's direction
    (direction; derived from ``effect`` for a difference); ``upper``/``lower``: the paper's bounds for groups a and
    b (separation); ``margin``: the largest difference that counts as no effect (equivalence), with ``margin_why``
    saying where it comes from; ``expect``: whether the census should find the thing, and ``every``: in each model
    rather than in some (census); ``unit``: of the measure."""

    kind: str
    effect: float | None = None
    sign: int | None = None
    upper: float | None = None
    lower: float | None = None
    margin: float | None = None
    margin_why: str = ""
    expect: bool | None = None
    every: bool = False
    unit: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"test kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        needs = {"difference": ("effect",), "separation": ("upper", "lower"), "direction": ("sign",),
                 "equivalence": ("margin",), "census": ("expect",), "qualitative": ()}[self.kind]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} test needs {', '.join(missing)}")
        if self.kind == "separation" and not self.upper < self.lower:
            raise ValueError(f"a separation needs upper < lower, got {self.upper} and {self.lower}")

    @property
    def direction(self) -> int:
        """+1 or -1: the paper's direction of a - b (a separation expects b above a: a - b negative)."""
        if self.kind == "difference":
            return 1 if self.effect > 0 else -1
        if self.kind == "separation":
            return -1
        return int(self.sign or 1)

    @property
    def paper_size(self) -> float | None:
        """The size of the paper's effect in its direction (a difference's effect, a separation's gap)."""
        if self.kind == "difference":
            return abs(self.effect)
        if self.kind == "separation":
            return self.lower - self.upper
        return None


@dataclass(frozen=True)
class Paper:
    """What the paper reports for a claim and where it measured it: ``values`` (named numbers, e.g. {"Baseline":
    0.316, "Modern": 0.008}; empty when the seed gives none), ``dataset``, ``model`` and ``scale`` (schedule, seeds:
    what the seed says, and what it leaves unstated)."""

    values: dict[str, float] = field(default_factory=dict)
    dataset: str = ""
    model: str = ""
    scale: str = ""

    def describe(self) -> str:
        """'Baseline 0.316, Modern 0.008 (CIFAR-100; compact ViT ...)'."""
        shown = ", ".join(f"{name} {value:g}" for name, value in self.values.items()) or "no number"
        where = "; ".join(part for part in (self.dataset, self.model) if part)
        return f"{shown} ({where})" if where else shown


@dataclass(frozen=True)
class Claim:
    """One claim of a seed.

    - ``id``: 'L2', 'S3', 'R8' (the rows of ``../shared/SEED-CLAIMS.md``); ``study``: locality, sparse or registers;
    - ``statement``: the claim in one sentence; ``seed_words``: what the seed says, in English, beside it;
    - ``paper``: its numbers and where they were measured; ``test``: how vitscope judges it;
    - ``measure``: the quantity compared (e.g. 'min_early_mad'); ``a`` and ``b``: the conditions or token groups
      compared (a - b is the difference), in vitscope's names;
    - ``family``: the architecture family the seed states it for (registers), None for all;
    - ``vitscope``: how vitscope measures it and where that differs from the paper (the 'differs' column).
    """

    id: str
    study: str
    statement: str
    seed_words: str
    paper: Paper
    test: ClaimTest
    measure: str = ""
    a: str = ""
    b: str = ""
    family: str | None = None
    vitscope: str = ""

    def __post_init__(self) -> None:
        if self.study not in STUDIES:
            raise ValueError(f"claim {self.id}: study {self.study!r} is not one of {', '.join(STUDIES)}")
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(f"claim {self.id}: family {self.family!r} is not one of {', '.join(FAMILIES)}")

    @property
    def judged(self) -> bool:
        """Whether a statistic judges it (every kind but ``qualitative``)."""
        return self.test.kind != "qualitative"
