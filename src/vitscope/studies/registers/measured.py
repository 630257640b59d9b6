"""What each model the registers study measured is: where its weights come from (given, trained here, random,
planted), its architecture family and size, and which models pair up with and without registers.

``models`` are the study's model records (``results.json``'s ``models``: label, entry, planted, training, tokens,
thresholds, num_images, parameters). Families follow the registry (``vitscope.claims.registry.FAMILIES``): ``swin``
and ``pvt`` by their class, ``dino`` for DINO (v1) models (given with DINO weights, or trained here with the DINO
objective), ``plain`` for every other plain ViT. The size line is vitscope's: the seed names no size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vitscope.studies.models import loads_random_weights

LARGE_PARAMETERS = 250_000_000  # vitscope's line between small and large (ViT-L, about 300M, and up are large)
_DINO_V1 = re.compile(r"(?<![a-z0-9])dino(?![a-z]*v\d)(?=$|[^a-z0-9]|_)", re.IGNORECASE)
_REGISTERS = re.compile(r"[_-]reg\d+", re.IGNORECASE)


def is_random_model(model: dict[str, Any]) -> bool:
    """A measured model with random weights: neither trained here nor planted, and its entry names no weights
    (a preset or an untagged architecture); a pretrained model by name or file is not one."""
    return not model.get("training") and not model.get("planted") and loads_random_weights(model.get("entry"))


def model_groups(models: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The measured models' labels by where their weights come from: ``planted`` (constructed outliers),
    ``trained`` (here), ``random`` (``is_random_model``) and ``given`` (pretrained, by name or file)."""
    groups: dict[str, list[str]] = {"given": [], "trained": [], "random": [], "planted": []}
    for m in models:
        groups[origin(m)].append(m["label"])
    return groups


def origin(model: dict[str, Any]) -> str:
    """planted, trained, random or given (``model_groups``)."""
    return ("planted" if model.get("planted") else "trained" if model.get("training")
            else "random" if is_random_model(model) else "given")


def evidence(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The models whose measurements can be evidence for a claim: given or trained here (planted outliers are
    constructed, random weights are no model of any paper)."""
    return [m for m in models if origin(m) in ("given", "trained")]


def family(model: dict[str, Any]) -> str:
    """plain, dino, swin or pvt (module docstring)."""
    name = str((model.get("tokens") or {}).get("family", ""))
    if "swin" in name.lower():
        return "swin"
    if "pyramid" in name.lower() or "pvt" in name.lower():
        return "pvt"
    if (model.get("training") or {}).get("objective") == "dino":
        return "dino"
    entry = model.get("entry") or {}
    names = " ".join(str(entry.get(k) or "") for k in ("spec", "weights"))
    return "dino" if _DINO_V1.search(names.replace("/", " ")) else "plain"


def is_large(model: dict[str, Any]) -> bool:
    """At least ``LARGE_PARAMETERS`` parameters (vitscope's line)."""
    return (model.get("parameters") or 0) >= LARGE_PARAMETERS


def registers_of(model: dict[str, Any]) -> int:
    return len((model.get("tokens") or {}).get("registers") or [])


@dataclass
class Pair:
    """Models that differ only in their registers: ``without`` (0 registers) and ``with_`` (some), one label per
    seed for runs trained here (paired by seed), one each for given models (paired by image). ``kind``: trained
    or given; ``name``: how the report names the pair."""

    kind: str
    name: str
    without: list[str] = field(default_factory=list)
    with_: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)


def register_pairs(models: list[dict[str, Any]]) -> list[Pair]:
    """Every with/without-registers pair among the evidence models: runs trained here with the same objective and
    seed (each register count against 0), and given models whose spec differs only by a ``reg<N>`` part and whose
    load options agree (e.g. DINOv2 ViT-L/14 with and without reg4)."""
    pairs: list[Pair] = []
    runs: dict[tuple[str, int], dict[int, str]] = {}
    given: dict[str, list[dict[str, Any]]] = {}
    for m in evidence(models):
        training = m.get("training")
        if training:
            runs.setdefault((training.get("objective") or "supervised", registers_of(m)), {})[training.get("seed", 0)] \
                = m["label"]
        else:
            entry = m.get("entry") or {}
            key = _REGISTERS.sub("", str(entry.get("spec"))) + repr(sorted((entry.get("options") or {}).items()))
            given.setdefault(key, []).append(m)
    for (objective, count), by_seed in sorted(runs.items()):
        base = runs.get((objective, 0), {})
        seeds = sorted(set(by_seed) & set(base))
        if count and seeds:
            pairs.append(Pair("trained", f"{count} against 0 registers ({objective}, trained here)",
                              [base[s] for s in seeds], [by_seed[s] for s in seeds], seeds))
    for members in given.values():
        bare = [m for m in members if not registers_of(m)]
        for other in (m for m in members if registers_of(m)):
            for plain in bare:
                pairs.append(Pair("given", f"{other['label']} against {plain['label']}", [plain["label"]],
                                  [other["label"]]))
    return pairs
