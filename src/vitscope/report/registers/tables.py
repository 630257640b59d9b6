"""The registers report's tables, built from the study's rows and model records (``RegistersResults``).

A probe value on fewer than ``MIN_HELD_OUT`` held-out tokens (or images) is no evidence: its cell says how many
there were instead of a number.
"""

from __future__ import annotations

import html
from typing import Any

from vitscope.report.html import fmt, table
from vitscope.studies.registers.measured import family, is_random_model, origin
from vitscope.studies.registers.verdicts import MIN_HELD_OUT, artifact_layers, mode_tested

Rows = list[dict[str, Any]]


def by(rows: Rows, **match: Any) -> Rows:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def one(rows: Rows, **match: Any) -> float | None:
    found = by(rows, **match)
    return found[0]["value"] if found else None


def evidence_value(rows: Rows, **match: Any) -> float | str | None:
    """The value of the row matching ``match``, or 'too few (n < MIN)' when it rests on too few held-out units."""
    found = by(rows, **match)
    if not found:
        return None
    if found[0]["n"] < MIN_HELD_OUT:
        return f"too few ({found[0]['n']} < {MIN_HELD_OUT})"
    return found[0]["value"]


def title(model: dict[str, Any]) -> str:
    """A model's label as titles show it: random weights said so."""
    if is_random_model(model):
        return f"{model['label']} ({model['entry']['spec']}, random weights)"
    return model["label"]


def score(training: dict[str, Any]) -> tuple[float | None, str]:
    """A trained run's evaluation score and its name: kNN top-1 for DINO runs, top-1 for supervised ones."""
    if not training:
        return None, ""
    if training.get("objective") == "dino":
        return training.get("knn_top1"), "kNN top-1 (teacher)"
    return training.get("top1"), "top-1"


def _modes(rows: Rows, label: str) -> str:
    if not mode_tested(rows, label):
        return "not tested (older results)"
    return ", ".join(str(x) for x in artifact_layers(rows, label)) or "none"


def model_table(results: Any) -> str:
    out = []
    for m in results.models:
        training = m.get("training") or {}
        out.append({"model": m["label"], "spec": m["entry"]["spec"], "weights": "trained here" if training
                    else (m["entry"]["weights"] or "random"), "origin": origin(m), "family": family(m),
                    "parameters": m["parameters"], "registers": len(m["tokens"].get("registers", [])),
                    "objective": training.get("objective", ""), "eval score": score(training)[0],
                    "score is": score(training)[1], "layers with a separate mode": _modes(results.rows, m["label"]),
                    "thresholds": "; ".join(f"{t['spec']} = {t['value']:.4g} (layer {t['detection_layer']}"
                                            + (f", stage {t['stage']})" if t.get("stage") else ")")
                                            for t in m["thresholds"])})
    return table(out)


def _last_layer(rows: Rows, model: str) -> int:
    return max(r["layer"] for r in by(rows, model=model, metric="norm_median"))


def comparison(results: Any) -> str:
    rows, out = results.rows, []
    specs = [t["spec"] for t in results.models[0]["thresholds"] if "stage" not in t] if results.models else []
    for m in results.models:
        if m["tokens"]["kind"] != "plain":
            continue
        label, last = m["label"], _last_layer(rows, m["label"])
        training = m.get("training") or {}
        value, name = score(training)
        entry = {"model": label, "objective": training.get("objective", ""),
                 "registers": len(m["tokens"]["registers"]), "eval score": value, "score is": name,
                 "kNN at init": training.get("knn_top1_init"),
                 "separate mode at last layer": one(rows, model=label, layer=last, metric="separate_mode"),
                 "patch norm median": one(rows, model=label, layer=last, group="patch", metric="norm_median"),
                 "CLS norm": one(rows, model=label, layer=last, group="cls", metric="norm_mean"),
                 "register norm": one(rows, model=label, layer=last, group="register", metric="norm_mean")}
        for spec in specs:
            entry[f"high-norm {spec}"] = one(rows, model=label, layer=last, metric="high_norm_fraction",
                                             threshold=spec)
        entry["CLS mass on high-norm (last attn)"] = one(rows, model=label, layer=last,
                                                         metric="attention_mass_on_high_norm", group="cls-query")
        entry["their key share"] = one(rows, model=label, layer=last, metric="key_share")
        entry["image top-1 from CLS"] = evidence_value(rows, model=label, layer=last, group="cls", metric="image_top1")
        out.append(entry)
    return table(out)


def location(results: Any) -> str:
    rows, out = results.rows, []
    for m in results.models:
        label = m["label"]
        layers = sorted({r["layer"] for r in by(rows, model=label, metric="background_share")}
                        | {r["layer"] for r in by(rows, model=label, metric="patch_local_variance")})
        if not layers:
            continue
        layer = layers[-1]
        high = by(rows, model=label, layer=layer, group="high-norm", metric="patch_local_variance")
        out.append({"model": label, "layer": layer, "threshold": (high or by(rows, model=label, layer=layer))[0]
                    .get("threshold"), "separate mode here": one(rows, model=label, layer=layer,
                                                                 metric="separate_mode"),
                    "high-norm patches": high[0]["n"] if high else 0,
                    "background share (high-norm)": one(rows, model=label, layer=layer, group="high-norm",
                                                        metric="background_share"),
                    "background share (all, chance)": one(rows, model=label, layer=layer, group="patch",
                                                          metric="background_share"),
                    "intensity high-norm": one(rows, model=label, layer=layer, group="high-norm",
                                               metric="patch_intensity"),
                    "intensity normal": one(rows, model=label, layer=layer, group="normal", metric="patch_intensity"),
                    "variance high-norm": high[0]["value"] if high else None,
                    "variance normal": one(rows, model=label, layer=layer, group="normal",
                                           metric="patch_local_variance")})
    return table(out)


def attention(results: Any) -> str:
    rows, out = results.rows, []
    for m in results.models:
        label = m["label"]
        if m["tokens"]["kind"] != "plain":
            continue  # per stage, in their own table
        for layer in sorted({r["layer"] for r in by(rows, model=label, metric="key_share")}):
            share = one(rows, model=label, layer=layer, metric="key_share")
            if not share:
                continue
            out.append({"model": label, "attention layer": layer, "keys = token layer": layer - 1,
                        "CLS mass": one(rows, model=label, layer=layer, group="cls-query",
                                        metric="attention_mass_on_high_norm"),
                        "patch mass": one(rows, model=label, layer=layer, group="patch-query",
                                          metric="attention_mass_on_high_norm"),
                        "high-norm share of keys": share})
    return table(out)


def stages(results: Any) -> list[dict[str, Any]]:
    """Hierarchical models, one row per stage: its threshold, the high-norm fraction and whether the detection
    block has a separate mode, the attention mass on high-norm keys against their share of visible keys (mean over
    the stage's attention layers), and what single tokens of the stage carry (its last block)."""
    rows, out = results.rows, []
    for m in results.models:
        if m["tokens"]["kind"] == "plain":
            continue
        label = m["label"]
        primary = m["thresholds"][0]["spec"] if m["thresholds"] else None
        for t in (t for t in m["thresholds"] if t["spec"] == primary):
            stage, layer = t["stage"], t["detection_layer"]
            attn = by(rows, model=label, stage=stage, layer_kind="attention")
            mass = [r["value"] for r in attn if r["metric"] == "attention_mass_on_high_norm"]
            share = [r["value"] for r in attn if r["metric"] == "key_share"]
            entry = {"model": label, "stage": stage, "blocks": f"{min(r['layer'] for r in attn)}-{layer}"
                     if attn else layer, "threshold": f"{primary} = {t['value']:.4g}",
                     "high-norm fraction": one(rows, model=label, layer=layer, metric="high_norm_fraction",
                                               threshold=primary),
                     "separate mode": one(rows, model=label, layer=layer, metric="separate_mode"),
                     "mass on high-norm": sum(mass) / len(mass) if mass else None,
                     "share of visible keys": sum(share) / len(share) if share else None,
                     "keys": attn[0].get("keys") if attn else None}
            for group in ("high-norm", "normal", "patch"):
                entry[f"position top-1 {group}"] = evidence_value(rows, model=label, layer=layer, group=group,
                                                                  metric="position_top1")
            for group in ("high-norm", "normal", "patch-mean"):
                entry[f"class top-1 {group}"] = evidence_value(rows, model=label, layer=layer, group=group,
                                                               metric="class_top1")
            out.append(entry)
    return out


def _chance_of(row: dict[str, Any], label: str, owned: bool) -> bool:
    """Whether a row may stand as ``label``'s chance level: chance rows name their model (``chance_for``), since the
    level depends on its grid and stride; results written before that field carry none (any is taken)."""
    if row["model"] != "chance":
        return True
    return row.get("chance_for") == label if owned else "chance_for" not in row


METRICS = ("position_top1", "position_distance", "pixels_mse", "pixels_mlp_mse", "class_top1", "image_top1")


def probe_tables(results: Any) -> str:
    """One table per model and probed layer: rows are token groups, each cell 'value (random init / chance)', or
    'too few' when the group's held-out tokens are under ``MIN_HELD_OUT``."""
    rows, parts = results.rows, []
    metrics = tuple(m for m in METRICS if any(r["metric"] == m for r in rows))  # only the probes that ran
    for m in results.models:
        label = m["label"]
        owned = any(r.get("chance_for") == label for r in rows)
        mine = [r for r in rows if r["metric"] in metrics and r["model"] in (label, f"{label} (random init)", "chance")
                and _chance_of(r, label, owned) and r.get("layer_kind") == "token"]
        for layer in sorted({r["layer"] for r in mine if r["model"] == label}):
            at = [r for r in mine if r["layer"] == layer]
            table_rows = []
            for group in dict.fromkeys(r["group"] for r in at if r["model"] == label):
                cells: dict[str, Any] = {"group": group}
                for metric in metrics:
                    ours = by(at, group=group, metric=metric, model=label)
                    rand, chance = (one(at, group=group, metric=metric, model=source)
                                    for source in (f"{label} (random init)", "chance"))
                    cells[metric] = "n/a" if not ours else (
                        f"too few ({ours[0]['n']} < {MIN_HELD_OUT})" if ours[0]["n"] < MIN_HELD_OUT
                        else f"{ours[0]['value']:.3g} ({fmt(rand)} / {fmt(chance)})")
                cells["held out"] = max((r["n"] for r in at if r["group"] == group and r["model"] == label), default=0)
                table_rows.append(cells)
            stage = next((r["stage"] for r in at if r.get("stage")), None)
            where = f"token layer {layer}" + (f" (stage {stage}, its grid and stride)" if stage else "")
            parts.append(f"<h3>{html.escape(label)}, {where}</h3>" + table(table_rows))
    return "".join(parts) or "<p>(no token probes were run)</p>"


def detector_check(rows: Rows, models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each model measured with planted outliers: the planted layer, the layers whose own norms have a separate
    mode, the first layer where the ``auto`` threshold finds high-norm tokens, and the fraction it finds against the
    planted fraction; what the probes read from the planted tokens against normal ones (too few: not shown)."""
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
        entry = {"model": m["label"], "planted at token layer": plant["layer"] + 1,
                 "layers with a separate mode": _modes(rows, m["label"]), "first layer found (auto)": first,
                 "planted fraction": plant["count"] / patches,
                 "found fraction (last layer)": fractions[-1][1] if fractions else None,
                 "exact": bool(fractions) and first == plant["layer"] + 1
                 and abs(fractions[-1][1] - plant["count"] / patches) < 1e-9}
        probed = sorted({r["layer"] for r in rows if r["model"] == m["label"] and r["metric"] == "position_top1"
                         and r["group"] == "high-norm"})
        if probed:
            for metric in ("position_top1", "class_top1"):
                for group in ("high-norm", "normal"):
                    entry[f"{metric} {group} (layer {probed[-1]})"] = evidence_value(
                        rows, model=m["label"], layer=probed[-1], group=group, metric=metric)
        out.append(entry)
    return out
