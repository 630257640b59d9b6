"""The readings of the locality paper's measures that its seed leaves open, and each run's value under one.

The seed says "minimum MAD" of the early layers without saying how MAD treats CLS or which layers are early.
vitscope states one reading, the default (``STATED``): CLS dropped and rows renormalised over patch keys, early =
the first quarter of the layers (or the layers the user names). The others, reported beside every verdict:

- MAD with CLS counted at distance 0 (the raw patch mass, ``renormalize=False``): a head that sinks its
  attention on CLS reads near 0 here and near uniform under the stated reading;
- early layers = layers 1-2 (the first quarter is layer 1 alone in a 4-layer model; in vit-compact's 8 layers
  both are layers 1-2, and the reading is not repeated).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitscope.metrics import early_layers as first_quarter
from vitscope.studies.locality.records import LocalityRun

MAD_READINGS = {"mad": "MAD over patch keys, CLS excluded and rows renormalised",
                "mad_cls_at_zero": "MAD with CLS counted at distance 0"}
STATED_MAD = "mad"
FIRST_TWO = [0, 1]


@dataclass(frozen=True)
class Reading:
    """One reading: which MAD (``mad``: a key of ``MAD_READINGS``) and which layers are early (0-based)."""

    mad: str
    early: tuple[int, ...]
    early_words: str

    @property
    def layers_text(self) -> str:
        return layer_text([i + 1 for i in self.early])

    def name(self, stated: Reading) -> str:
        """How a report names it beside the stated reading: 'CLS counted at distance 0 in MAD', 'early = layers 1
        and 2', both; 'the stated reading' for the stated one."""
        parts = []
        if self.mad != stated.mad:
            parts.append(MAD_READINGS[self.mad].replace("MAD with ", "") + " in MAD")
        if self.early != stated.early:
            quarter = " (the first quarter)" if self.early_words == "the first quarter" else ""
            parts.append(f"early = {self.layers_text}{quarter}")
        return " and ".join(parts) or "the stated reading"


def layer_text(layers: list[int]) -> str:
    """Layer numbers as a reader writes them: '1', '1 and 2', '1-3', 'none'."""
    if not layers:
        return "none"
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    if len(layers) == 1:
        return f"layer {layers[0]}"
    return "layers " + ", ".join(map(str, layers[:-1])) + " and " + str(layers[-1])


def stated(num_layers: int, named: list[int] | None = None) -> Reading:
    """The reading a verdict uses: CLS excluded and rows renormalised; early = ``named`` (0-based) when given, else
    the first quarter of ``num_layers``."""
    words = "the layers named" if named else "the first quarter"
    return Reading(STATED_MAD, tuple(first_quarter(num_layers, named)), words)


def others(runs: list[LocalityRun], named: list[int] | None = None, *, mad: bool = True) -> list[Reading]:
    """The other readings these runs allow, each once: every (MAD, early layers) pair but the stated one. MAD with
    CLS at distance 0 only when every run recorded it (and ``mad``); early = layers 1-2 and the first quarter where
    they differ from the stated layers."""
    count = runs[0].num_layers
    main = stated(count, named)
    layer_choices = [main]
    for early, words in ((tuple(first_quarter(count)), "the first quarter"), (tuple(FIRST_TWO), "the first two")):
        if max(early) < count and early not in [c.early for c in layer_choices]:
            layer_choices.append(Reading(STATED_MAD, early, words))
    mads = [STATED_MAD] + (["mad_cls_at_zero"] if mad and all(r.mad_cls_at_zero for r in runs) else [])
    found = [Reading(m, c.early, c.early_words) for m in mads for c in layer_choices]
    return [r for r in found if r != main]


def unread(runs: list[LocalityRun]) -> str:
    """Why a reading is missing from these runs' verdicts ('' when none is)."""
    if runs and not all(r.mad_cls_at_zero for r in runs):
        return ("MAD with CLS counted at distance 0 was not recorded by these runs (measured before vitscope kept "
                "it); the verdicts here read only CLS excluded")
    return ""


def early_heads(run: LocalityRun, reading: Reading, measure: str | None = None) -> np.ndarray:
    """A run's values of ``measure`` (default: the reading's MAD) over every head of the reading's early layers,
    flattened, NaN heads dropped."""
    values = np.asarray(run.measure(measure or reading.mad), dtype=float)[list(reading.early)].ravel()
    return values[~np.isnan(values)]


def min_early_mad(run: LocalityRun, reading: Reading) -> float:
    """The smallest head MAD of the early layers (NaN when no head was measured)."""
    values = early_heads(run, reading)
    return float(values.min()) if values.size else float("nan")


def early_entropy(run: LocalityRun, reading: Reading) -> float:
    """The mean normalised entropy over every head of the early layers."""
    values = early_heads(run, reading, "entropy")
    return float(values.mean()) if values.size else float("nan")
