"""The registers study's published findings, checked against its own rows (pure Python, no models).

A model *has artifacts* at a layer when it has a separate high-norm mode (``vitscope.metrics.high_norm``, the
test ``vitscope analyze norms`` prints too): the ``auto`` (Otsu) split of its patch-token norms leaves at most
``MAX_FRACTION`` of patches above a threshold that is at least ``MIN_RATIO`` times the median patch norm, not the
tail of one distribution. Models measured with planted outliers are
constructed, so they check the detector and probes but never count as evidence for a finding.

A finding that compares the high-norm and normal groups of a model (what they carry, where they sit) uses the
one rule of every study (``vitscope.stats.compare``): an interval that resamples images (the rows' per-image
``units``), never tokens, and at least ``MIN_HELD_OUT`` held-out tokens in each group; otherwise that model is
inconclusive and the evidence says why. Each comparison's effect is stated once, in ``EFFECTS``. Every finding
also says whether what we measured agrees with the paper's claim (``agrees``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitscope.metrics.high_norm import is_separate_mode
from vitscope.stats import Comparison, Precondition, compare, verdict
from vitscope.studies.models import loads_random_weights

ENRICHMENT = 2.0  # attention mass at least this many times the high-norm tokens' share of keys
MIN_HELD_OUT = 16  # held-out tokens per group below which a comparison is no evidence
LARGE_PARAMETERS = 250_000_000  # "large" in the paper's sense: ViT-L (about 300M parameters) and up

# (direction of high-norm minus normal, effect, how much counts) per compared measure; the verdict's threshold is
# half the effect. The papers give directions, not effect sizes at our scale: the sizes are ours.
EFFECTS: dict[str, tuple[int, float, str]] = {
    "position_top1": (-1, 0.20, "ours: high-norm tokens lose position, by 0.20 top-1"),
    "class_top1": (+1, 0.04, "ours: high-norm tokens carry the image class better, by 0.04 top-1"),
    "patch_local_variance": (-1, 0.50, "ours: high-norm patches have half the normal patches' local variance "
                                       "(relative to the normal mean)"),
}
AGREES = {"reproduced": "agrees", "not reproduced": "disagrees", "mixed": "partly", "inconclusive": "undecided",
          "not testable": "not tested"}

PUBLISHED = {
    "exist": "Large, long-trained ViTs (DINOv2, OpenCLIP, DeiT-III) grow a few percent of high-norm patch tokens; "
             "DINO v1 and small models do not (Darcet et al.)",
    "layers": "They appear in the middle-to-late layers, not the first ones",
    "background": "They sit on redundant, low-variance background patches",
    "global": "They lose local information (position, pixels) and carry global information (image class)",
    "attention": "The CLS token attends to them far more than their share",
    "registers": "Registers remove them",
}


def is_random_model(model: dict[str, Any]) -> bool:
    """A measured model with random weights: neither trained here nor planted, and its entry names no weights
    (a preset or an untagged architecture); a pretrained model by name or file is not one."""
    return not model.get("training") and not model.get("planted") and loads_random_weights(model.get("entry"))


def model_groups(models: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The measured models' labels by where their weights come from: ``planted`` (constructed outliers),
    ``trained`` (here), ``random`` (``is_random_model``) and ``given`` (pretrained, by name or file)."""
    groups: dict[str, list[str]] = {"given": [], "trained": [], "random": [], "planted": []}
    for m in models:
        kind = ("planted" if m.get("planted") else "trained" if m.get("training")
                else "random" if is_random_model(m) else "given")
        groups[kind].append(m["label"])
    return groups


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next((row for row in rows if all(row.get(k) == v for k, v in match.items())), None)


def _units(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit values and image labels from a row's per-image sums and counts: each image's mean repeated once
    per unit, which gives the image-clustered interval exactly each image's sum and count."""
    units = row["units"]
    counts = np.asarray(units["counts"], dtype=int)
    means = np.asarray(units["sums"], dtype=float) / np.maximum(counts, 1)
    return np.repeat(means, counts), np.repeat(np.asarray(units["images"]), counts)


def group_comparison(rows: list[dict[str, Any]], model: str, layer: int, metric: str
                     ) -> tuple[Comparison | None, str]:
    """high-norm minus normal on ``metric`` at ``layer`` of ``model``: (the comparison, '') or (None, why not)."""
    high = _row(rows, model=model, layer=layer, group="high-norm", metric=metric)
    normal = _row(rows, model=model, layer=layer, group="normal", metric=metric)
    if high is None or normal is None:
        return None, f"{model}: no {metric} of both groups at layer {layer}"
    if min(high["n"], normal["n"]) < MIN_HELD_OUT:
        return None, (f"{model}: {high['n']} high-norm and {normal['n']} normal tokens held out for {metric} "
                      f"(needs >= {MIN_HELD_OUT} in each group)")
    if "units" not in high or "units" not in normal:
        return None, f"{model}: {metric} rows have no per-image units to build an interval from (measure again)"
    sign, effect, _ = EFFECTS[metric]
    if metric == "patch_local_variance":  # a relative effect: a fraction of the normal patches' mean
        effect *= abs(normal["value"]) or 1.0
    (a, ia), (b, ib) = _units(high), _units(normal)
    return compare(a, b, sign=sign, threshold=effect / 2, clusters=(ia, ib)), ""


def _said(model: str, metric: str, result: Comparison) -> str:
    return (f"{model}: {metric} high-norm - normal {result.difference:+.3g} (paper's direction "
            f"{'+' if result.sign > 0 else '-'}, effect {result.paper_effect:.3g}; 95% interval {result.low:+.3g} to "
            f"{result.high:+.3g}, {result.n_a} vs {result.n_b} images, {result.method}): {result.verdict}; "
            f"{result.power_line()}")


def _value(rows: list[dict[str, Any]], **match: Any) -> float | None:
    found = _row(rows, **match)
    return None if found is None else found["value"]


def artifact_layers(rows: list[dict[str, Any]], model: str) -> list[int]:
    """Token layers where ``model`` has a separate high-norm mode (see the module docstring)."""
    layers = []
    for row in rows:
        if (row["model"], row["metric"], row.get("threshold"), row.get("group")) != (
                model, "high_norm_fraction", "auto", "patch") or row.get("layer_kind") != "token":
            continue
        median = _value(rows, model=model, layer=row["layer"], group="patch", metric="norm_median")
        if median and is_separate_mode(row["value"], row["threshold_value"], median):
            layers.append(row["layer"])
    return sorted(layers)


def _verdict(supported: list[str], against: list[str], untested: str, undecided: list[str] | None = None
             ) -> tuple[str, str]:
    undecided = undecided or []
    notes = [f"inconclusive for {'; '.join(undecided)}"] if undecided else []
    if not supported and not against:  # not testable (the one rule's precondition) when no model could be measured
        return verdict(("inconclusive", "; ".join(notes)), Precondition(bool(undecided), untested))
    if supported and not against:
        return "reproduced", "; ".join([f"holds for {', '.join(supported)}", *notes])
    if against and not supported:
        return "not reproduced", "; ".join([f"fails for {', '.join(against)}", *notes])
    return "mixed", "; ".join([f"holds for {', '.join(supported)}", f"fails for {', '.join(against)}", *notes])


def _exist(models: list[dict[str, Any]], with_artifacts: dict[str, list[int]]) -> tuple[str, str]:
    """Large models have artifacts and small ones do not: both halves are evidence, each for its own models."""
    size = {m["label"]: m.get("parameters") or 0 for m in models if m["label"] in with_artifacts}
    large = [label for label in with_artifacts if size[label] >= LARGE_PARAMETERS]
    small = [label for label in with_artifacts if size[label] < LARGE_PARAMETERS]
    parts = []
    if small:
        clean = [label for label in small if not with_artifacts[label]]
        parts.append(f"no small model (under {LARGE_PARAMETERS / 1e6:.0f}M parameters) has a separate high-norm mode "
                     f"({', '.join(small)}), as the paper says small models do not" if len(clean) == len(small)
                     else f"small models with a separate high-norm mode, against the paper: "
                          f"{', '.join(label for label in small if with_artifacts[label])}")
    if large:
        grown = [label for label in large if with_artifacts[label]]
        parts.append(f"large models with artifacts, as the paper says: {', '.join(grown)}" if len(grown) == len(large)
                     else f"large models without artifacts, against the paper: "
                          f"{', '.join(label for label in large if not with_artifacts[label])}")
    else:
        parts.append("no large model measured, so the paper's main claim is untested here")
    supported = [m for m in small if not with_artifacts[m]] + [m for m in large if with_artifacts[m]]
    against = [m for m in small if with_artifacts[m]] + [m for m in large if not with_artifacts[m]]
    decided, _ = _verdict(supported, against, "no measured model (planted ones aside)")
    if decided == "reproduced" and not large:  # clean small models alone cannot show that large ones have artifacts
        decided = "inconclusive"
    return decided, "; ".join(parts)


def findings(rows: list[dict[str, Any]], models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per published finding: ``finding``, ``published``, ``verdict``, ``agrees`` (whether what we
    measured agrees with the paper's claim) and ``evidence``."""
    real = [m["label"] for m in models if not m.get("planted")]
    with_artifacts = {label: artifact_layers(rows, label) for label in real}
    has = [label for label, layers in with_artifacts.items() if layers]
    none_note = "no measured model (planted ones aside) has a separate high-norm mode at this scale"
    out = [{"finding": "exist", **dict(zip(("verdict", "evidence"), _exist(models, with_artifacts), strict=True))}]
    early = [m for m in has if with_artifacts[m][0] <= 1]
    out.append({"finding": "layers", **dict(zip(("verdict", "evidence"), _verdict(
        [m for m in has if m not in early], early, none_note), strict=True))})
    out.append({"finding": "background", **dict(zip(("verdict", "evidence"), _compared(
        rows, has, with_artifacts, ("patch_local_variance",), none_note), strict=True))})
    out.append({"finding": "global", **dict(zip(("verdict", "evidence"), _compared(
        rows, has, with_artifacts, ("position_top1", "class_top1"), none_note + " (or it was not probed)"),
        strict=True))})
    attend, ignore = [], []
    for label in has:
        layer = with_artifacts[label][-1]  # attention layer l + 1 reads token layer l
        mass = _value(rows, model=label, layer=layer + 1, group="cls-query", metric="attention_mass_on_high_norm")
        share = _value(rows, model=label, layer=layer + 1, group="high-norm", metric="key_share")
        if mass is not None and share:
            (attend if mass >= ENRICHMENT * share else ignore).append(label)
    out.append({"finding": "attention", **dict(zip(("verdict", "evidence"), _verdict(attend, ignore, none_note),
                                                   strict=True))})
    out.append({"finding": "registers", **dict(zip(("verdict", "evidence"), _registers_verdict(models, with_artifacts),
                                                   strict=True))})
    return [entry | {"published": PUBLISHED[entry["finding"]], "agrees": AGREES[entry["verdict"]]} for entry in out]


def _compared(rows: list[dict[str, Any]], has: list[str], with_artifacts: dict[str, list[int]],
              metrics: tuple[str, ...], untested: str) -> tuple[str, str]:
    """A finding that holds for a model when every one of ``metrics`` is reproduced (high-norm against normal at
    the model's last artifact layer), fails when one is not reproduced, and is inconclusive otherwise."""
    supported, against, undecided, said = [], [], [], []
    for label in has:
        layer = with_artifacts[label][-1]
        if all(_row(rows, model=label, layer=layer, group="high-norm", metric=m) is None for m in metrics):
            continue  # not measured (e.g. not probed): untested for this model, not undecided
        results, missing = [], []
        for metric in metrics:
            result, why = group_comparison(rows, label, layer, metric)
            (results.append(result) if result is not None else missing.append(why))
        said += [_said(label, m, r) for m, r in zip(metrics, results, strict=False) if not missing]
        if missing:
            undecided.append("; ".join(missing))
        elif any(r.verdict == "not reproduced" for r in results):
            against.append(label)
        elif all(r.verdict == "reproduced" for r in results):
            supported.append(label)
        else:
            undecided.append(f"{label}: " + "; ".join(r.reason for r in results if r.verdict == "inconclusive"))
    decided, evidence = _verdict(supported, against, untested, undecided)
    return decided, "; ".join([evidence, *said]) if said else evidence


def _registers_verdict(models: list[dict[str, Any]], with_artifacts: dict[str, list[int]]) -> tuple[str, str]:
    """Registers remove artifacts: judged within each training objective (supervised, DINO) separately, so that
    models are only compared with models trained the same way."""
    by_objective: dict[str, dict[str, int]] = {}
    for m in models:
        training = m.get("training") or {}
        if training.get("registers") is not None and not m.get("planted"):
            by_objective.setdefault(training.get("objective") or "supervised", {})[m["label"]] = training["registers"]
    cleaned, kept, notes = [], [], []
    for objective, trained in by_objective.items():
        without = [label for label, r in trained.items() if r == 0]
        withreg = [label for label, r in trained.items() if r > 0]
        if not without or not withreg:
            notes.append(f"{objective}: needs trained models with and without registers")
        elif not any(with_artifacts[label] for label in without):
            notes.append(f"{objective}: the models without registers ({', '.join(without)}) grew no artifacts "
                         "to remove")
        else:
            cleaned += [label for label in withreg if not with_artifacts[label]]
            kept += [label for label in withreg if with_artifacts[label]]
    testable = Precondition(bool(cleaned or kept), "; ".join(notes) or "needs trained models with and without "
                                                                       "registers")
    decided, evidence = verdict(_verdict(cleaned, kept, "") if testable.met else ("", ""), testable)
    return decided, "; ".join([evidence, *notes]) if testable.met else evidence


def detector_check(rows: list[dict[str, Any]], models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each model measured with planted outliers: the planted layer, the first layer where the ``auto``
    threshold finds high-norm tokens, and the fraction it finds against the planted fraction."""
    out = []
    for m in models:
        plant = m.get("planted")
        if not plant:
            continue
        fractions = sorted((r["layer"], r["value"]) for r in rows
                           if r["model"] == m["label"] and r["metric"] == "high_norm_fraction"
                           and r.get("threshold") == "auto" and r.get("layer_kind") == "token")
        first = next((layer for layer, value in fractions if value > 0), None)
        patches = m["tokens"]["patches"]["count"]
        entry = {"model": m["label"], "planted at token layer": plant["layer"] + 1, "first layer found": first,
                 "planted fraction": plant["count"] / patches, "found fraction (last layer)": fractions[-1][1],
                 "exact": first == plant["layer"] + 1 and abs(fractions[-1][1] - plant["count"] / patches) < 1e-9}
        probed = sorted({r["layer"] for r in rows if r["model"] == m["label"] and r["metric"] == "position_top1"
                         and r["group"] == "high-norm"})
        if probed:  # what the probes read from the planted tokens against normal ones, last probed layer
            for metric in ("position_top1", "class_top1"):
                for group in ("high-norm", "normal"):
                    entry[f"{metric} {group} (layer {probed[-1]})"] = _value(
                        rows, model=m["label"], layer=probed[-1], group=group, metric=metric)
        out.append(entry)
    return out
