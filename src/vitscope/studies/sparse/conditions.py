"""The sparse study's conditions: what each trained backbone differs in.

A condition is ``<normaliser>[+reg<R>][+spec]``: the attention normaliser (``softmax``, ``entmax15``, ``sparsemax``,
``entmax:ALPHA``, ...), optionally R registers, and optionally CLS/patch Specialization
(``vitscope.models.own.specialization``: the CLS token's own parameters in the norms and early qkv projections).
``specialization`` names the paper's Specialization baseline, ``softmax+spec``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from vitscope.attention import parse_normalizer

BASELINE = "softmax"  # the paper's CLS baseline
SPECIALIZATION = "specialization"  # the paper's CLS/patch Specialization baseline: softmax with specialization
PATTERN = re.compile(r"^(?P<normaliser>.+?)(?:\+reg(?P<registers>\d+))?(?P<spec>\+spec)?$")


class Condition(NamedTuple):
    """A parsed condition: ``normaliser``, ``registers`` (count) and ``specialized`` (CLS/patch Specialization)."""

    normaliser: str
    registers: int = 0
    specialized: bool = False

    def model_options(self) -> dict[str, Any]:
        """The model options that make this condition (``TrainConfig.model_options``)."""
        options: dict[str, Any] = {"attention": self.normaliser, "num_registers": self.registers}
        if self.specialized:
            options["cls_specialization"] = True
        return options


def parse_condition(text: str) -> Condition:
    """``<normaliser>[+reg<R>][+spec]`` or ``specialization`` -> ``Condition``; a bad normaliser names the valid
    ones."""
    name = text.strip()
    if name == SPECIALIZATION:
        return Condition(BASELINE, 0, True)
    match = PATTERN.match(name)
    if not match or not name:
        raise ValueError(f"condition {text!r} must be <normaliser>[+reg<R>][+spec] or {SPECIALIZATION}, e.g. "
                         "entmax15, softmax+reg4 or specialization")
    normaliser = match.group("normaliser")
    try:
        parse_normalizer(normaliser)
    except ValueError as err:
        raise ValueError(f"condition {text!r}: {err}") from None
    return Condition(normaliser, int(match.group("registers") or 0), bool(match.group("spec")))
