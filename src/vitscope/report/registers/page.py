"""The registers study's report: figures (PNG) and one self-contained ``report.html``, built only from the study's
files (``results.json`` and each model's ``models/<label>/census.json`` and ``census.safetensors``)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from vitscope.atomic_io import atomic_write_bytes
from vitscope.metrics.high_norm import MAX_FRACTION, MIN_RATIO
from vitscope.report.figures.norms import high_norm_maps
from vitscope.report.html import fmt, image, index_link, page, study_results, table
from vitscope.report.openings import registers_opening
from vitscope.report.registers import figures as rf
from vitscope.report.render import trusted
from vitscope.studies.registers.findings import (
    EFFECTS,
    ENRICHMENT,
    MIN_HELD_OUT,
    detector_check,
    findings,
    is_random_model,
    model_groups,
)
from vitscope.studies.registers.study import load_census_tensors

TERMS = ("<p><b>Terms, used once and for all.</b> A <i>high-norm token</i> is a patch token whose L2 norm (block "
         "output, before the final norm) exceeds a threshold fixed on the detection layer and applied to every "
         "layer; CLS and registers are never candidates. An <i>outlier</i> is the statistical notion (the tail above "
         "a threshold, present in every model: a percentile threshold flags its percentage by construction). An "
         "<i>artifact</i> is the phenomenon of Darcet et al.: a separate high-norm mode of a few percent of "
         f"patches, tested here as an <code>auto</code> (Otsu) split leaving at most {MAX_FRACTION:.0%} of "
         f"patches above a threshold at least {MIN_RATIO:g}x the median patch norm. <i>Planted</i> outliers are "
         "made by a documented forward hook (<code>vitscope.models.own.planted</code>) to test the detector and "
         "probes; they are never evidence.</p>")
METRICS = {
    "high_norm_fraction": "fraction of patch tokens above the threshold (threshold and its value beside it)",
    "background_share": "high-norm group: fraction of high-norm patches on background (object pixels < half the "
                        "patch, or centre outside every box); patch group: the same for all patches (chance)",
    "patch_intensity / patch_local_variance": "mean and variance of the channel-mean pixel intensity over the patch",
    "attention_mass_on_high_norm": "attention layer l: mass that CLS (patch) queries put on the high-norm patches "
                                   "of token layer l-1, heads (and queries) averaged; key_share: their share of keys. "
                                   "Swin: over the keys of the query's own window it can see (padding and the "
                                   "shifted-window mask removed), share = high-norm fraction of those keys; PVT-v2: "
                                   "on the reduced key grid, a reduced key is high-norm when its pooled cell holds a "
                                   "high-norm token",
    "eval score": "supervised runs: top-1 of the classifier on the evaluation split; DINO runs: weighted kNN top-1 "
                  "(k = 20) of the teacher backbone's CLS features, training images as the bank",
    "position_top1 / position_distance": "linear probe token -> patch index: top-1 and mean grid distance (patches)",
    "pixels_mse / pixels_mlp_mse": "ridge (2-layer MLP) probe token -> its patch's normalised pixels: MSE",
    "class_top1": "logistic probe single token -> image class: top-1",
}


def _by(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _one(rows: list[dict[str, Any]], **match: Any) -> float | None:
    found = _by(rows, **match)
    return found[0]["value"] if found else None


def _last_layer(rows: list[dict[str, Any]], model: str) -> int:
    return max(r["layer"] for r in _by(rows, model=model, metric="norm_median"))


def _score(training: dict[str, Any]) -> tuple[float | None, str]:
    """A trained run's evaluation score and its name: kNN top-1 for DINO runs, top-1 for supervised ones."""
    if not training:
        return None, ""
    if training.get("objective") == "dino":
        return training.get("knn_top1"), "kNN top-1 (teacher)"
    return training.get("top1"), "top-1"


def _model_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for m in results["models"]:
        training = m.get("training") or {}
        out.append({"model": m["label"], "spec": m["entry"]["spec"], "weights": "trained here" if training
                    else (m["entry"]["weights"] or "random"), "parameters": m["parameters"],
                    "registers": len(m["tokens"].get("registers", [])), "kind": m["tokens"]["kind"],
                    "objective": training.get("objective", ""), "eval score": _score(training)[0],
                    "score is": _score(training)[1], "planted": "yes" if m.get("planted") else "",
                    "thresholds": "; ".join(f"{t['spec']} = {t['value']:.4g} (layer {t['detection_layer']}"
                                            + (f", stage {t['stage']})" if t.get("stage") else ")")
                                            for t in m["thresholds"])})
    return out


def _comparison(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows, out = results["rows"], []
    specs = [t["spec"] for t in results["models"][0]["thresholds"] if "stage" not in t] if results["models"] else []
    for m in results["models"]:
        if m["tokens"]["kind"] != "plain":
            continue
        label, last = m["label"], _last_layer(rows, m["label"])
        training = m.get("training") or {}
        score, name = _score(training)
        entry = {"model": label, "objective": training.get("objective", ""),
                 "registers": len(m["tokens"]["registers"]), "eval score": score, "score is": name,
                 "kNN at init": training.get("knn_top1_init"),
                 "patch norm median": _one(rows, model=label, layer=last, group="patch", metric="norm_median"),
                 "CLS norm": _one(rows, model=label, layer=last, group="cls", metric="norm_mean"),
                 "register norm": _one(rows, model=label, layer=last, group="register", metric="norm_mean")}
        for spec in specs:
            entry[f"high-norm {spec}"] = _one(rows, model=label, layer=last, metric="high_norm_fraction",
                                              threshold=spec)
        entry["CLS mass on high-norm (last attn)"] = _one(rows, model=label, layer=last,
                                                          metric="attention_mass_on_high_norm", group="cls-query")
        entry["their key share"] = _one(rows, model=label, layer=last, metric="key_share")
        for group in ("cls", "register0"):
            entry[f"class top-1 {group}"] = _one(rows, model=label, layer=last, group=group, metric="class_top1")
        out.append(entry)
    return out


def _location(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows, out = results["rows"], []
    for m in results["models"]:
        label = m["label"]
        layers = sorted({r["layer"] for r in _by(rows, model=label, metric="background_share")}
                        | {r["layer"] for r in _by(rows, model=label, metric="patch_local_variance")})
        if not layers:
            continue
        layer = layers[-1]
        high = _by(rows, model=label, layer=layer, group="high-norm", metric="patch_local_variance")
        out.append({"model": label, "layer": layer, "threshold": (high or _by(rows, model=label, layer=layer))[0]
                    .get("threshold"), "high-norm patches": high[0]["n"] if high else 0,
                    "background share (high-norm)": _one(rows, model=label, layer=layer, group="high-norm",
                                                         metric="background_share"),
                    "background share (all, chance)": _one(rows, model=label, layer=layer, group="patch",
                                                           metric="background_share"),
                    "intensity high-norm": _one(rows, model=label, layer=layer, group="high-norm",
                                                metric="patch_intensity"),
                    "intensity normal": _one(rows, model=label, layer=layer, group="normal", metric="patch_intensity"),
                    "variance high-norm": high[0]["value"] if high else None,
                    "variance normal": _one(rows, model=label, layer=layer, group="normal",
                                            metric="patch_local_variance")})
    return out


def _attention(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows, out = results["rows"], []
    for m in results["models"]:
        label = m["label"]
        if m["tokens"]["kind"] != "plain":
            continue  # per stage, in their own table
        for layer in sorted({r["layer"] for r in _by(rows, model=label, metric="key_share")}):
            share = _one(rows, model=label, layer=layer, metric="key_share")
            if not share:
                continue
            out.append({"model": label, "attention layer": layer, "keys = token layer": layer - 1,
                        "CLS mass": _one(rows, model=label, layer=layer, group="cls-query",
                                         metric="attention_mass_on_high_norm"),
                        "patch mass": _one(rows, model=label, layer=layer, group="patch-query",
                                           metric="attention_mass_on_high_norm"),
                        "high-norm share of keys": share})
    return out


def _stages(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Hierarchical models, one row per stage: its threshold, the high-norm fraction at its detection block, the
    attention mass on high-norm keys against their share of visible keys (mean over the stage's attention
    layers), and what single tokens of the stage carry (its last block)."""
    rows, out = results["rows"], []
    for m in results["models"]:
        if m["tokens"]["kind"] == "plain":
            continue
        label = m["label"]
        primary = m["thresholds"][0]["spec"] if m["thresholds"] else None
        for t in (t for t in m["thresholds"] if t["spec"] == primary):
            stage, layer = t["stage"], t["detection_layer"]
            attention = _by(rows, model=label, stage=stage, layer_kind="attention")
            mass = [r["value"] for r in attention if r["metric"] == "attention_mass_on_high_norm"]
            share = [r["value"] for r in attention if r["metric"] == "key_share"]
            entry = {"model": label, "stage": stage, "blocks": f"{min(r['layer'] for r in attention)}-{layer}"
                     if attention else layer, "threshold": f"{primary} = {t['value']:.4g}",
                     "high-norm fraction": _one(rows, model=label, layer=layer, metric="high_norm_fraction",
                                                threshold=primary),
                     "mass on high-norm": sum(mass) / len(mass) if mass else None,
                     "share of visible keys": sum(share) / len(share) if share else None,
                     "keys": attention[0].get("keys") if attention else None}
            for group in ("high-norm", "normal", "patch"):
                entry[f"position top-1 {group}"] = _one(rows, model=label, layer=layer, group=group,
                                                        metric="position_top1")
            for group in ("high-norm", "normal", "patch-mean"):
                entry[f"class top-1 {group}"] = _one(rows, model=label, layer=layer, group=group, metric="class_top1")
            out.append(entry)
    return out


def _chance_of(row: dict[str, Any], label: str, owned: bool) -> bool:
    """Whether a row may stand as ``label``'s chance level: chance rows name their model (``chance_for``), since the
    level depends on its grid and stride; results written before that field carry none (any is taken)."""
    if row["model"] != "chance":
        return True
    return row.get("chance_for") == label if owned else "chance_for" not in row


def _probe_tables(results: dict[str, Any]) -> str:
    rows, parts = results["rows"], []
    metrics = ("position_top1", "position_distance", "pixels_mse", "pixels_mlp_mse", "class_top1")
    metrics = tuple(m for m in metrics if any(r["metric"] == m for r in rows))  # only the probes that ran
    for m in results["models"]:
        label = m["label"]
        owned = any(r.get("chance_for") == label for r in rows)
        mine = [r for r in rows if r["metric"] in metrics and r["model"] in (label, f"{label} (random init)", "chance")
                and _chance_of(r, label, owned) and r.get("layer_kind") == "token"
                and any(x["model"] == label and x["metric"] in metrics for x in rows)]
        for layer in sorted({r["layer"] for r in mine if r["model"] == label}):
            at = [r for r in mine if r["layer"] == layer]
            table_rows = []
            for group in dict.fromkeys(r["group"] for r in at if r["model"] == label):
                cells: dict[str, Any] = {"group": group}
                for metric in metrics:
                    ours, rand, chance = (_one(at, group=group, metric=metric, model=source)
                                          for source in (label, f"{label} (random init)", "chance"))
                    cells[metric] = "n/a" if ours is None else f"{ours:.3g} ({fmt(rand)} / {fmt(chance)})"
                cells["tokens"] = max((r["n"] for r in at if r["group"] == group and r["model"] == label), default=0)
                table_rows.append(cells)
            stage = next((r["stage"] for r in at if r.get("stage")), None)
            where = f"token layer {layer}" + (f" (stage {stage}, its grid and stride)" if stage else "")
            parts.append(f"<h3>{html.escape(label)}, {where}</h3>" + table(table_rows))
    return "".join(parts) or "<p>(no token probes were run)</p>"


def _title(model: dict[str, Any]) -> str:
    """A model's label as titles show it: random weights said so."""
    if is_random_model(model):
        return f"{model['label']} ({model['entry']['spec']}, random weights)"
    return model["label"]


def make_figures(out: Path, results: dict[str, Any]) -> dict[str, Path]:
    """Write every figure of the report into ``out/figures`` and return their paths by key."""
    fig_dir, rows, paths = out / "figures", results["rows"], {}
    specs = list(dict.fromkeys(r["threshold"] for r in _by(rows, metric="high_norm_fraction")))
    curves = {spec: {m["label"]: sorted((r["layer"], r["value"]) for r in _by(
        rows, model=m["label"], metric="high_norm_fraction", threshold=spec) if r.get("layer_kind") == "token")
        for m in results["models"]} for spec in specs}
    if curves:
        paths["fraction"] = rf.high_norm_fraction(curves, fig_dir / "high_norm_fraction.png")
    panels = {}
    images = None
    for m in results["models"]:
        label = m["label"]
        census = json.loads((out / "models" / label / "census.json").read_text())
        stages = {r["layer"]: r["stage"] for r in _by(rows, model=label) if r.get("stage") and "layer" in r}
        paths[f"hist:{label}"] = rf.norm_histograms(census["histograms"], census["thresholds"],
                                                    f"{_title(m)}: token norms per layer",
                                                    fig_dir / f"norms_{label}.png", stages=stages)
        tensors = {k: v.numpy() for k, v in load_census_tensors(out, label).items()}
        if "norm_maps" in tensors:
            shown = tensors["images"].transpose(0, 2, 3, 1)
            paths[f"maps:{label}"] = high_norm_maps(shown, tensors["norm_maps"], m["thresholds"][0]["value"],
                                                    fig_dir / f"artifacts_{label}.png",
                                                    layer=m["thresholds"][0].get("detection_layer"), model=_title(m))
            if not m.get("planted"):  # every plain model, registers or not, on the same images
                images = shown if images is None else images
                panels[label] = (tensors["cls_attention_last"], tuple(m["tokens"]["patches"]["grid"]),
                                 m["tokens"]["num_prefix_tokens"])
    if panels:
        paths["attention"] = rf.cls_attention(images, panels, fig_dir / "cls_attention_registers.png")
    return paths


def _verdict_list(entries: list[dict[str, Any]]) -> str:
    css = {"reproduced": "reproduced", "not reproduced": "not", "mixed": "not"}
    items = "".join(f"<li><span class='{css.get(e['verdict'], 'untested')}'>{html.escape(e['verdict'])}</span> "
                    f"(our measurement {html.escape(e['agrees'])} with the paper): {html.escape(e['published'])}. "
                    f"<i>{html.escape(e['evidence'])}.</i></li>" for e in entries)
    effects = table([{"measure (high-norm - normal)": metric, "paper's direction": "higher" if sign > 0 else "lower",
                      "effect": effect, "threshold (half)": effect / 2, "source": source}
                     for metric, (sign, effect, source) in EFFECTS.items()])
    rule = (f"<p>A comparison of high-norm and normal tokens follows the one rule of every study "
            f"(<code>vitscope.stats.compare</code>): a 95% interval that resamples images, never tokens, and at least "
            f"{MIN_HELD_OUT} held-out tokens in each group; reproduced when the interval excludes zero in the "
            f"paper's direction and the difference reaches half the effect, not reproduced when the whole interval "
            f"lies below half the effect, inconclusive otherwise. The effects, stated once:</p>")
    return f"<ul>{items}</ul>{rule}{effects}"


def _scale_note(results: dict[str, Any]) -> str:
    models = results["models"]
    groups = model_groups(models)
    given, trained, random, planted = groups["given"], groups["trained"], groups["random"], groups["planted"]
    parts = [f"Measured on <b>{html.escape(str(results['provenance']['dataset']))}</b>, "
             f"{models[0]['num_images'] if models else 0} evaluation images."]
    if trained:
        runs = {}
        for m in models:
            if m.get("training") and not m.get("planted"):
                runs.setdefault((m["training"].get("objective") or "supervised", m["training"].get("epochs")),
                                []).append(m["label"])
        parts.append("Trained here, same data and seeds: " + "; ".join(
            f"{html.escape(', '.join(labels))} ({objective}, {epochs} epoch{'' if epochs == 1 else 's'})"
            for (objective, epochs), labels in runs.items()) + ". Supervised runs are scored by top-1, DINO runs "
            "by kNN top-1 of the teacher.")
    if results["settings"].get("preset") == "demo":
        parts.append("The demo trains supervised runs only, to stay within its minutes; the same comparison under "
                     "the DINO objective is the <code>demo-dino</code> preset.")
    if given:
        parts.append(f"Given with their weights: {html.escape(', '.join(given))}.")
    if random:
        parts.append(f"With <i>random</i> weights (seeded initialisation): {html.escape(', '.join(random))}; they "
                     "show that the census runs on each geometry, not findings.")
    if planted:
        parts.append(f"Constructed: {html.escape(', '.join(planted))} (planted outliers).")
    parts.append("Artifacts need large models trained long" + ("; a small model trained for minutes is not expected "
                 "to grow them" if trained else "") + ", and this report claims only what these runs show.")
    return " ".join(parts)


def build_report(out: str | Path) -> Path:
    """Build ``report.html`` (figures embedded) from the study in ``out``; returns its path."""
    out = Path(out)
    results = study_results(out, "registers")
    paths = make_figures(out, results)
    checks = detector_check(results["rows"], results["models"])
    sections = [
        index_link(out),
        "<h1>Registers study: high-norm tokens across architectures, and what registers change</h1>",
        registers_opening(results), f'<p class="note">{_scale_note(results)}</p>', TERMS,
        "<h2>Published findings: reproduced or not at this scale</h2>",
        _verdict_list(findings(results["rows"], results["models"])),
        f"<p>CLS attention counts as enriched at {ENRICHMENT:g}x the high-norm tokens' share of keys.</p>",
    ]
    if checks:
        sections += ["<h2>Detector and probes on planted outliers</h2>", table(checks)]
    sections += ["<h2>Models</h2>", table(_model_table(results)),
                 "<h2>Registers comparison (last layer)</h2>", table(_comparison(results))]
    if "fraction" in paths:
        sections += ["<h2>High-norm fraction per layer</h2><p>Each threshold is fixed on its detection layer and "
                     "applied to every layer (Swin and PVT-v2: one threshold per stage).</p>",
                     image(paths["fraction"], "high-norm fraction per layer")]
    sections += ["<h2>Token norms (log scale)</h2>"] + [image(p, k) for k, p in paths.items() if k.startswith("hist:")]
    sections += ["<h2>Artifact maps (detection layer, first threshold; red: high-norm)</h2>"]
    titles = {m["label"]: _title(m) for m in results["models"]}
    sections += [f"<h3>{html.escape(titles.get(k[5:], k[5:]))}</h3>" + image(p, k) for k, p in paths.items()
                 if k.startswith("maps:")]
    sections += ["<h2>Where high-norm tokens sit</h2>", table(_location(results)),
                 "<h2>What attends to them</h2>", table(_attention(results))]
    stages = _stages(results)
    if stages:
        sections += ["<h2>Hierarchical models (Swin, PVT-v2), per stage</h2><p>Each stage has its own threshold, "
                     "fixed on its last block. Attention mass is measured on each model's own geometry: a Swin query "
                     "over the keys of its window that it can see; PVT-v2 on the reduced key grid (a reduced key is "
                     "high-norm when its pooled cell holds a high-norm token). Probes read the stage's last block: "
                     "position over the stage's grid, pixels over its stride, class from one token; these models "
                     "have no CLS (the patch mean stands in).</p>", table(stages)]
    if "attention" in paths:
        sections += ["<h2>Attention maps with and without registers</h2>", image(paths["attention"], "CLS attention")]
    sections += ["<h2>Token probes</h2><p>Rows: token groups; each cell reads <i>value (randomly initialised "
                 "backbone / chance level)</i>; tokens: per split. Position and pixel probes apply to patch tokens "
                 "only (n/a otherwise).</p>", _probe_tables(results),
                 "<h2>Definitions</h2>", table([{"quantity": k, "definition": v} for k, v in METRICS.items()]),
                 "<h2>Settings</h2>", table([{"setting": k, "value": json.dumps(v) if isinstance(v, dict | list)
                                              else v} for k, v in results["settings"].items()]),
                 "<h2>Provenance</h2>", table([{"field": k, "value": v} for k, v in results["provenance"].items()
                                               if k != "config"])]
    return atomic_write_bytes(out / "report.html", page("vitscope registers study", trusted(sections)))
