"""Models that a study measures instead of training its own: ``--model LABEL=SPEC[@WEIGHTS]`` (repeatable).

``SPEC`` is anything ``vitscope.models.load`` takes (a preset, ``timm:NAME[.TAG]``, ``hf:ORG/NAME[@REV]``, a run
folder or weights file); ``@WEIGHTS`` names a local weights file for it (the last ``@`` splits; in an ``hf:`` spec,
which takes no weights file, ``@`` is the hub revision). ``LABEL`` names the model in
results and reports (letters, digits and ``._+-``). Shared by every study that takes ``--model``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

LABEL = re.compile(r"^[A-Za-z0-9._+-]+$")


@dataclass(frozen=True)
class ModelEntry:
    """One model of a study: a label, a spec for ``vitscope.models.load``, optional local weights and load
    options (e.g. ``img_size``, ``depth`` for a small random timm model)."""

    label: str
    spec: str
    weights: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    thresholds: tuple[str, ...] = ()  # this model's high-norm threshold specs; empty: the study's

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", tuple(self.thresholds))  # a list from JSON reads back as a tuple
        if not LABEL.match(self.label):
            raise ValueError(f"model label {self.label!r} may hold only letters, digits and ._+-; "
                             "e.g. --model dinov2-reg=timm:vit_small_patch14_reg4_dinov2@weights.safetensors")

    def load(self) -> nn.Module:
        from vitscope.models import load

        return load(self.spec, weights=self.weights, **self.options)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "spec": self.spec, "weights": self.weights, "options": dict(self.options),
                "thresholds": list(self.thresholds)}


def loads_random_weights(entry: dict[str, Any] | None) -> bool:
    """True when a model entry as results record it (``ModelEntry.to_dict()``) loads random weights
    (``vitscope.models.has_random_weights``): a preset or an untagged architecture, with no weights file."""
    from vitscope.models import has_random_weights

    if not entry or not entry.get("spec"):
        return False
    return has_random_weights(entry["spec"], entry.get("weights"), (entry.get("options") or {}).get("pretrained"))


def parse_model_entry(text: str, flag: str = "--model") -> ModelEntry:
    """``LABEL=SPEC[@WEIGHTS]`` -> ModelEntry; a bad form names the option (``flag``) and the expected form."""
    label, sep, rest = text.partition("=")
    if not sep or not label.strip() or not rest.strip():
        raise ValueError(f"{flag} {text!r} needs the form LABEL=SPEC[@WEIGHTS], e.g. "
                         f"{flag} deit3=timm:deit3_small_patch16_224@deit3_small.safetensors or {flag} mine=runs/x")
    if rest.strip().startswith("hf:"):  # hf: takes no weights file; its '@' is the hub revision (hf:ORG/NAME@REV)
        return ModelEntry(label.strip(), rest.strip())
    spec, at, weights = rest.strip().rpartition("@")
    if not at:
        spec, weights = weights, None
    elif not spec or not weights:
        raise ValueError(f"{flag} {text!r}: both SPEC and WEIGHTS must be given around '@'")
    return ModelEntry(label.strip(), spec, weights)


def parse_model_entries(texts: list[str], flag: str = "--model", img_size: int | None = None) -> list[ModelEntry]:
    """Several ``--model`` (or ``flag``) values; labels must be unique. ``img_size`` (``--img-size``): every
    model loaded and measured at that side in pixels (its position table resampled), else at its own."""
    entries = [parse_model_entry(t, flag) for t in texts]
    labels = [e.label for e in entries]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"model label(s) {', '.join(repeated)} given more than once; give each {flag} its own label")
    if img_size is None:
        return entries
    return [dataclasses.replace(e, options={**e.options, "img_size": img_size}) for e in entries]
