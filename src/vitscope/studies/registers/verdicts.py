"""The registers study's verdicts: every claim of seed 004 in the registry (``vitscope.claims.registers``) judged on
the study's rows and models by the one rule (``vitscope.claims.judge``), once per architecture family, as typed
``Judgement`` objects (no prose here: ``vitscope.report.registers`` words them).

- A model *has high-norm tokens* (in the claims' sense) at a token layer when that layer's own patch-token norms
  have a separate high-norm mode (the census's ``separate_mode`` rows, ``vitscope.metrics.high_norm``: vitscope's
  test, the seed names none). Planted and randomly initialised models are never evidence
  (``measured.evidence``).
- R1 (some small models grow them): a census of the small models (under ``LARGE_PARAMETERS``, vitscope's line).
  R2 (DINO v1 never does): a census of DINO (v1) models. A census verdict that rests on absence (R1 not reproduced,
  R2 reproduced) needs pretrained models given with their weights: clean models trained here (often for minutes)
  show nothing about the paper's; and R1, existential and architecture-dependent, needs clean given small models of
  ``MIN_FAMILIES`` or more families. Otherwise such a verdict reads inconclusive.
- R3, R4-*, R5-*, R8-*: the high-norm group against the other patches of the same images, at each model's deepest
  layer that has a separate mode and the measure, pooled over the family's models with images as clusters (an image
  seen by several models is one cluster), at least ``MIN_HELD_OUT`` held-out tokens per group and model.
- R9: CLS + the mean high-norm token against CLS alone, per held-out image (paired), an equivalence.
- R6, R7: each with/without-registers pair (``measured.register_pairs``): trained here, per seed (paired); given,
  per image (paired). Both need the model without registers to have a separate mode (the seed speaks of models
  that had the artifacts); otherwise not testable.
- R10 is qualitative: not judged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from vitscope.claims import Claim, Judgement, claim, claims_of
from vitscope.claims.judge import judge, judge_census, missing, not_judged
from vitscope.stats import Precondition
from vitscope.studies.registers.measured import (
    LARGE_PARAMETERS,
    Pair,
    evidence,
    family,
    is_large,
    origin,
    register_pairs,
)

MIN_HELD_OUT = 16  # held-out tokens per group and model below which a comparison is no evidence
MIN_FAMILIES = 2  # R1 reads 'not reproduced' only when the clean given small models span this many families
FAMILY_NAMES = {"plain": "plain ViT", "dino": "DINO (v1)", "swin": "Swin", "pvt": "PVT"}
OUR_TEST = "high-norm tokens: a separate mode in a layer's own norms (vitscope's largest-gap test)"
GROUPS = ("high-norm group: patches above the census's first threshold (auto: the separate mode's split, set on the "
          "detection layer); normal: the other patches of the same images")
CLS_PROBE = ("a logistic image classifier on CLS and on CLS with the mean high-norm token, same images, per held-out "
             "image")
Rows = list[dict[str, Any]]


def _match(rows: Rows, **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def mode_tested(rows: Rows, model: str) -> bool:
    """Whether the rows test ``model``'s layers for a separate mode (results written before that test do not)."""
    return any(r["metric"] == "separate_mode" and r["model"] == model for r in rows)


def artifact_layers(rows: Rows, model: str) -> list[int]:
    """Token layers whose own patch-token norms have a separate high-norm mode (the census's per-layer test)."""
    return sorted(r["layer"] for r in _match(rows, model=model, metric="separate_mode") if r["value"] >= 0.5)


def _units(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit values and image labels from a row's per-image sums and counts: each image's mean repeated once
    per unit, which gives the image-clustered interval exactly each image's sum and count."""
    units = row["units"]
    counts = np.asarray(units["counts"], dtype=int)
    means = np.asarray(units["sums"], dtype=float) / np.maximum(counts, 1)
    return np.repeat(means, counts), np.repeat(np.asarray(units["images"]), counts)


def _described(models: list[dict[str, Any]]) -> str:
    return ", ".join(f"{m['label']} ({origin(m)}, {(m.get('parameters') or 0) / 1e6:.3g}M)" for m in models)


def _layers(used: list[tuple[dict[str, Any], int]]) -> str:
    return "layers " + ", ".join(f"{m['label']} {layer}" for m, layer in used) if used else ""


def _scope(models: list[dict[str, Any]], data: str, extra: str = "") -> str:
    if not models:
        return f"no such model among those measured here on {data or 'the study data'}"
    images = max((m.get("num_images") or 0 for m in models), default=0)
    parts = [f"{len(models)} model{'s' if len(models) != 1 else ''} measured here on {data or 'the study data'} "
             f"({images} images): {_described(models)}", extra,
             "the seed names none of the paper's models, data or thresholds"]
    return "; ".join(p for p in parts if p)


def _census(c: Claim, candidates: list[dict[str, Any]], rows: Rows, data: str, what: str, families: int = 1
            ) -> Judgement:
    """A census claim on ``candidates``. A verdict that rests on absence (R1: none has them; R2: none has them)
    needs pretrained models given with their weights, of ``families`` or more families: models trained here, or
    one family's models, cannot show that none grows them; such a verdict reads inconclusive."""
    tested = [m for m in candidates if mode_tested(rows, m["label"])]
    if not tested:
        why = f"no {what} was measured" if not candidates else \
            f"the results of {', '.join(m['label'] for m in candidates)} predate the per-layer mode test; measure again"
        return missing(c, why, scope=_scope(candidates, data))
    layers = {m["label"]: artifact_layers(rows, m["label"]) for m in tested}
    given = sorted({family(m) for m in tested if origin(m) == "given"})
    details = {"layers": layers, "given_families": given,
               "parameters": {m["label"]: m.get("parameters") for m in tested}}
    j = judge_census(c, {label: bool(found) for label, found in layers.items()}, details=details,
                     scope=_scope(tested, data, f"{what}; {OUR_TEST}"))
    absent = j.verdict == ("not reproduced" if c.test.expect else "reproduced")
    if absent and len(given) < families:
        j = dataclasses.replace(j, verdict="inconclusive", reason=(
            f"{j.reason}; a verdict that rests on absence needs "
            + (f"pretrained models of {families} or more families" if families > 1 else "a pretrained model")
            + f" given with their weights (here: {', '.join(given) or 'none'}): models trained here"
            + (", or one family's models," if families > 1 else "") + " cannot show that none grows them"))
    return j


def _r1(rows: Rows, models: list[dict[str, Any]], data: str) -> Judgement:
    small = [m for m in evidence(models) if not is_large(m)]
    return _census(claim("R1"), small, rows, data, f"small models (under {LARGE_PARAMETERS / 1e6:.0f}M parameters: "
                                                   "vitscope's line, the seed names no size)", MIN_FAMILIES)


def _deepest(rows: Rows, label: str, layers: list[int], measure: str, groups: tuple[str, str]
             ) -> tuple[int, dict, dict] | str:
    """(layer, row a, row b) at the deepest of ``layers`` with both groups measured, or why there is none."""
    for layer in sorted(layers, reverse=True):
        found = [_match(rows, model=label, layer=layer, group=g, metric=measure) for g in groups]
        if all(found):
            a, b = found[0][0], found[1][0]
            if "units" not in a or "units" not in b:
                return f"{label}: {measure} rows have no per-image units (measure again)"
            if min(a["n"], b["n"]) < MIN_HELD_OUT:
                return (f"{label}: {a['n']} {groups[0]} and {b['n']} {groups[1]} tokens for {measure} at layer {layer}"
                        f" (needs {MIN_HELD_OUT} or more in each)")
            return layer, a, b
    return f"{label}: no {measure} of both groups at its mode layers {layers}"


def _family_models(c: Claim, rows: Rows, models: list[dict[str, Any]], data: str
                   ) -> tuple[list[tuple[dict, list[int]]], Judgement | None]:
    """The family's evidence models with their mode layers, or the 'not testable' judgement saying why none."""
    members = [m for m in evidence(models) if family(m) == c.family]
    name = FAMILY_NAMES[c.family]
    if not members:
        return [], missing(c, f"no {name} model was measured", scope=_scope(members, data))
    untested = [m["label"] for m in members if not mode_tested(rows, m["label"])]
    with_modes = [(m, artifact_layers(rows, m["label"])) for m in members]
    with_modes = [(m, layers) for m, layers in with_modes if layers]
    if not with_modes:
        why = (f"the results of {', '.join(untested)} predate the per-layer mode test; measure again" if untested else
               f"none of the {name} models measured has a separate high-norm mode at any layer: no high-norm tokens "
               "in the claim's sense to compare")
        return [], missing(c, why, scope=_scope(members, data, OUR_TEST))
    return with_modes, None


def _groups(c: Claim, rows: Rows, models: list[dict[str, Any]], data: str) -> Judgement:
    """A family's high-norm group against its other patches (module docstring)."""
    with_modes, none = _family_models(c, rows, models, data)
    if none is not None:
        return none
    a, ia, b, ib, used, why, per_model = [], [], [], [], [], [], {}
    for m, layers in with_modes:
        found = _deepest(rows, m["label"], layers, c.measure, ("high-norm", "normal"))
        if isinstance(found, str):
            why.append(found)
            continue
        layer, high, normal = found
        (va, ca), (vb, cb) = _units(high), _units(normal)
        a.append(va), ia.append(ca), b.append(vb), ib.append(cb)
        used.append((m, layer))
        one = judge(c, va, vb, clusters=(ca, cb), unit="images", layer=layer)
        per_model[m["label"]] = {"layer": layer, "difference": one.difference, "ci95_low": one.ci95_low,
                                 "ci95_high": one.ci95_high, "verdict": one.verdict}
    scope = _scope([m for m, _ in used] or [m for m, _ in with_modes], data,
                   "; ".join([_layers(used), GROUPS, *why]))
    if not used:
        return missing(c, "; ".join(why), scope=scope)
    j = judge(c, np.concatenate(a), np.concatenate(b), clusters=(np.concatenate(ia), np.concatenate(ib)),
              unit="images", scope=scope, layer=used[0][1] if len(used) == 1 else None)
    return dataclasses.replace(j, details={**j.details, "models": per_model})


def _r9(rows: Rows, models: list[dict[str, Any]], data: str) -> Judgement:
    c = claim("R9")
    with_modes, none = _family_models(c, rows, models, data)
    if none is not None:
        return none
    a, b, images, used, why = [], [], [], [], []
    for m, layers in with_modes:
        found = _deepest(rows, m["label"], layers, "image_top1", ("cls+high-norm", "cls (high-norm images)"))
        if isinstance(found, str):
            why.append(found)
            continue
        layer, with_tokens, alone = found
        if with_tokens["units"]["images"] != alone["units"]["images"]:
            why.append(f"{m['label']}: the two classifiers were scored on different images")
            continue
        a.append(_units(with_tokens)[0]), b.append(_units(alone)[0]), images.append(_units(alone)[1])
        used.append((m, layer))
    scope = _scope([m for m, _ in used] or [m for m, _ in with_modes], data, "; ".join(
        [_layers(used), CLS_PROBE, *why]))
    if not used:
        return missing(c, "; ".join(why), scope=scope)
    return judge(c, np.concatenate(a), np.concatenate(b), paired=True, clusters=np.concatenate(images),
                 unit="images", scope=scope, layer=used[0][1] if len(used) == 1 else None)


def _mode_fraction(rows: Rows, model: dict[str, Any]) -> tuple[np.ndarray, list[int]] | float:
    """Per image, the share of patches in the model's deepest separate mode (0 without one): (values, images)
    for given models; for runs trained here, one number (the whole evaluation set's share)."""
    layers = artifact_layers(rows, model["label"])
    found = _match(rows, model=model["label"], metric="separate_mode", layer=layers[-1])[0] if layers else None
    if model.get("training"):
        return float(found["mode_fraction"]) if found else 0.0
    if found is None:
        count = int(model.get("num_images") or 0)
        return np.zeros(count), list(range(count))
    units = found["units"]
    shares = np.asarray(units["sums"], dtype=float) / np.maximum(np.asarray(units["counts"], dtype=float), 1)
    return shares, list(units["images"])


def _top1(rows: Rows, model: dict[str, Any]) -> tuple[np.ndarray, list[int]] | float | None:
    """A model's classification: a run's own score (top-1; kNN top-1 of a DINO teacher), or per held-out image the
    CLS classifier's outcome at the model's last probed layer (given models)."""
    training = model.get("training")
    if training:
        return training.get("knn_top1" if training.get("objective") == "dino" else "top1")
    found = sorted(_match(rows, model=model["label"], group="cls", metric="image_top1"), key=lambda r: r["layer"])
    if not found:
        return None
    values, images = _units(found[-1])
    return values, images.tolist()


def _pair(c: Claim, pair: Pair, rows: Rows, by_label: dict[str, dict[str, Any]], data: str) -> Judgement:
    """R6 or R7 on one with/without-registers pair."""
    without, with_ = [by_label[x] for x in pair.without], [by_label[x] for x in pair.with_]
    grown = [m["label"] for m in without if artifact_layers(rows, m["label"])]
    precondition = Precondition(bool(grown), f"the models without registers ({', '.join(pair.without)}) have no "
                                             "separate high-norm mode: no artifacts for registers to remove")
    value = _mode_fraction if c.id == "R6" else _top1
    scope = _scope(without + with_, data, f"pair: {pair.name}" + (f", seeds {pair.seeds}" if pair.seeds else ""))
    labels = {"a_label": ", ".join(pair.with_), "b_label": ", ".join(pair.without)}
    values_a, values_b = [value(rows, m) for m in with_], [value(rows, m) for m in without]
    if any(v is None for v in values_a + values_b):
        return missing(c, f"no classification score for {pair.name} (run the CLS probe)", scope=scope)
    if pair.kind == "trained":
        return judge(c, values_a, values_b, paired=True, precondition=precondition, scope=scope, **labels)
    (a, images_a), (b, images_b) = values_a[0], values_b[0]
    if images_a != images_b:
        return missing(c, f"{pair.name}: the two models were measured on different images", scope=scope)
    return judge(c, a, b, paired=True, clusters=np.asarray(images_a), precondition=precondition, unit="images",
                 scope=scope, **labels)


def judge_claims(rows: Rows, models: list[dict[str, Any]], data: str = "") -> list[Judgement]:
    """Every registers claim of the registry, in its order, judged on ``rows`` and ``models`` (module docstring);
    ``data`` names the evaluation data in each verdict's scope."""
    by_label = {m["label"]: m for m in models}
    pairs = register_pairs(models)
    out: list[Judgement] = []
    for c in claims_of("registers"):
        if c.id == "R1":
            out.append(_r1(rows, models, data))
        elif c.id == "R2":
            dino = [m for m in evidence(models) if family(m) == "dino"]
            out.append(_census(c, dino, rows, data, "DINO (v1) models"))
        elif c.id in ("R6", "R7"):
            found = [_pair(c, p, rows, by_label, data) for p in pairs]
            out += found or [missing(c, "no pair of models with and without registers was measured (train "
                                        "--registers 0,4, or give e.g. DINOv2 with and without reg4)")]
        elif c.id == "R9":
            out.append(_r9(rows, models, data))
        elif c.test.kind == "qualitative":
            out.append(not_judged(c, "every claim above is judged per architecture family (plain ViT, DINO, Swin, "
                                     "PVT), never with another family's direction"))
        else:
            out.append(_groups(c, rows, models, data))
    return out
