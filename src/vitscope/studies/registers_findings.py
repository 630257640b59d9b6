"""The registers study's published findings, checked against its own rows (pure Python, no models).

A model *has artifacts* at a layer when the ``auto`` (Otsu) split of its patch-token norms leaves at most
``MAX_FRACTION`` of patches above a threshold that is at least ``MIN_RATIO`` times the median patch norm: a
separate high-norm mode, not the tail of one distribution. Models measured with planted outliers are
constructed, so they check the detector and probes but never count as evidence for a finding.
"""

from __future__ import annotations

from typing import Any

MAX_FRACTION = 0.10
MIN_RATIO = 2.0
ENRICHMENT = 2.0  # attention mass at least this many times the high-norm tokens' share of keys

PUBLISHED = {
    "exist": "Large, long-trained ViTs (DINOv2, OpenCLIP, DeiT-III) grow a few percent of high-norm patch tokens; "
             "DINO v1 and small models do not (Darcet et al.)",
    "layers": "They appear in the middle-to-late layers, not the first ones",
    "background": "They sit on redundant, low-variance background patches",
    "global": "They lose local information (position, pixels) and carry global information (image class)",
    "attention": "The CLS token attends to them far more than their share",
    "registers": "Registers remove them",
}


def _value(rows: list[dict[str, Any]], **match: Any) -> float | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row["value"]
    return None


def artifact_layers(rows: list[dict[str, Any]], model: str) -> list[int]:
    """Token layers where ``model`` has a separate high-norm mode (see the module docstring)."""
    layers = []
    for row in rows:
        if (row["model"], row["metric"], row.get("threshold"), row.get("group")) != (
                model, "high_norm_fraction", "auto", "patch") or row.get("layer_kind") != "token":
            continue
        median = _value(rows, model=model, layer=row["layer"], group="patch", metric="norm_median")
        if median and 0 < row["value"] <= MAX_FRACTION and row["threshold_value"] >= MIN_RATIO * median:
            layers.append(row["layer"])
    return sorted(layers)


def _verdict(supported: list[str], against: list[str], untested: str) -> tuple[str, str]:
    if not supported and not against:
        return "not testable", untested
    if supported and not against:
        return "reproduced", f"holds for {', '.join(supported)}"
    if against and not supported:
        return "not reproduced", f"fails for {', '.join(against)}"
    return "mixed", f"holds for {', '.join(supported)}; fails for {', '.join(against)}"


def findings(rows: list[dict[str, Any]], models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per published finding: ``finding``, ``published``, ``verdict`` and ``evidence``."""
    real = [m["label"] for m in models if not m.get("planted")]
    with_artifacts = {label: artifact_layers(rows, label) for label in real}
    has = [label for label, layers in with_artifacts.items() if layers]
    none_note = "no measured model (planted ones aside) has a separate high-norm mode at this scale"
    out = [{"finding": "exist", "verdict": "reproduced" if has else "not reproduced",
            "evidence": (f"separate high-norm mode in {', '.join(has)}" if has else none_note)}]
    early = [m for m in has if with_artifacts[m][0] <= 1]
    out.append({"finding": "layers", **dict(zip(("verdict", "evidence"), _verdict(
        [m for m in has if m not in early], early, none_note), strict=True))})
    at_bg, not_bg = [], []
    for label in has:
        last = with_artifacts[label][-1]
        high = _value(rows, model=label, layer=last, group="high-norm", metric="patch_local_variance")
        normal = _value(rows, model=label, layer=last, group="normal", metric="patch_local_variance")
        if high is not None and normal is not None:
            (at_bg if high < normal else not_bg).append(label)
    out.append({"finding": "background", **dict(zip(("verdict", "evidence"), _verdict(at_bg, not_bg, none_note),
                                                    strict=True))})
    glob, loc = [], []
    for label in has:
        last = with_artifacts[label][-1]
        pos = [_value(rows, model=label, layer=last, group=g, metric="position_top1") for g in ("high-norm", "normal")]
        cls = [_value(rows, model=label, layer=last, group=g, metric="class_top1") for g in ("high-norm", "normal")]
        if None not in pos and None not in cls:
            (glob if pos[0] < pos[1] and cls[0] >= cls[1] else loc).append(label)
    out.append({"finding": "global", **dict(zip(("verdict", "evidence"), _verdict(
        glob, loc, none_note + " (or it was not probed)"), strict=True))})
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
    return [entry | {"published": PUBLISHED[entry["finding"]]} for entry in out]


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
    if not cleaned and not kept:
        return "not testable", "; ".join(notes) or "needs trained models with and without registers"
    verdict, evidence = _verdict(cleaned, kept, "")
    return verdict, "; ".join([evidence, *notes])


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
