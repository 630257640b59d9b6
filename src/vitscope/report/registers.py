"""The registers study's report: figures (PNG) and one self-contained ``report.html``, built only from the study's
files (``results.json`` and each model's ``models/<label>/census.json`` and ``census.safetensors``)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from safetensors.numpy import load_file

from vitscope.files import atomic_write_bytes
from vitscope.report import registers_figures as rf
from vitscope.report.html import fmt, image, page, table
from vitscope.report.norm_figures import high_norm_maps
from vitscope.studies.registers_findings import ENRICHMENT, MAX_FRACTION, MIN_RATIO, detector_check, findings

TERMS = ("<p><b>Terms, used once and for all.</b> A <i>high-norm token</i> is a patch token whose L2 norm (block "
         "output, before the final norm) exceeds a threshold fixed on the detection layer and applied to every "
         "layer; CLS and registers are never candidates. An <i>outlier</i> is the statistical notion (the tail above "
         "a threshold, present in every model: a percentile threshold flags its percentage by construction). An "
         "<i>artifact</i> is the phenomenon of Darcet et al.: a separate high-norm mode of a few percent of "
         f"patches, tested here as an <code>auto</code> (Otsu) split leaving at most {MAX_FRACTION:.0%} of "
         f"patches above a threshold at least {MIN_RATIO:g}x the median patch norm. <i>Planted</i> outliers are "
         "made by a documented forward hook (<code>vitscope.models.planted</code>) to test the detector and probes; "
         "they are never evidence.</p>")
METRICS = {
    "high_norm_fraction": "fraction of patch tokens above the threshold (threshold and its value beside it)",
    "background_share": "high-norm group: fraction of high-norm patches on background (object pixels < half the "
                        "patch, or centre outside every box); patch group: the same for all patches (chance)",
    "patch_intensity / patch_local_variance": "mean and variance of the channel-mean pixel intensity over the patch",
    "attention_mass_on_high_norm": "attention layer l: mass that CLS (patch) queries put on the high-norm patches "
                                   "of token layer l-1, heads (and queries) averaged; key_share: their share of keys",
    "position_top1 / position_distance": "linear probe token -> patch index: top-1 and mean grid distance (patches)",
    "pixels_mse": "ridge probe token -> its patch's normalised pixels: MSE",
    "class_top1": "logistic probe single token -> image class: top-1",
}


def _by(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _one(rows: list[dict[str, Any]], **match: Any) -> float | None:
    found = _by(rows, **match)
    return found[0]["value"] if found else None


def _last_layer(rows: list[dict[str, Any]], model: str) -> int:
    return max(r["layer"] for r in _by(rows, model=model, metric="norm_median"))


def _model_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for m in results["models"]:
        training = m.get("training") or {}
        out.append({"model": m["label"], "spec": m["entry"]["spec"], "weights": "trained here" if training
                    else (m["entry"]["weights"] or "random"), "parameters": m["parameters"],
                    "registers": len(m["tokens"].get("registers", [])), "kind": m["tokens"]["kind"],
                    "top-1 (eval)": training.get("top1"), "planted": "yes" if m.get("planted") else "",
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
        entry = {"model": label, "registers": len(m["tokens"]["registers"]),
                 "top-1": (m.get("training") or {}).get("top1"),
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


def _probe_tables(results: dict[str, Any]) -> str:
    rows, parts = results["rows"], []
    metrics = ("position_top1", "position_distance", "pixels_mse", "class_top1")
    for m in results["models"]:
        label = m["label"]
        mine = [r for r in rows if r["metric"] in metrics and r["model"] in (label, f"{label} (random init)", "chance")
                and r.get("layer_kind") == "token" and any(x["model"] == label and x["metric"] in metrics
                                                           for x in rows)]
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
            parts.append(f"<h3>{html.escape(label)}, token layer {layer}</h3>" + table(table_rows))
    return "".join(parts) or "<p>(no token probes were run)</p>"


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
        paths[f"hist:{label}"] = rf.norm_histograms(census["histograms"], census["thresholds"],
                                                    f"{label}: token norms per layer", fig_dir / f"norms_{label}.png")
        tensors = load_file(str(out / "models" / label / "census.safetensors"))
        if "norm_maps" in tensors:
            shown = tensors["images"].transpose(0, 2, 3, 1)
            paths[f"maps:{label}"] = high_norm_maps(shown, tensors["norm_maps"], m["thresholds"][0]["value"],
                                                    fig_dir / f"artifacts_{label}.png")
            if m.get("training") and not m.get("planted"):
                images = shown if images is None else images
                panels[label] = (tensors["cls_attention_last"], tuple(m["tokens"]["patches"]["grid"]),
                                 m["tokens"]["num_prefix_tokens"])
    if panels:
        paths["attention"] = rf.cls_attention(images, panels, fig_dir / "cls_attention_registers.png")
    return paths


def _verdict_list(entries: list[dict[str, Any]]) -> str:
    css = {"reproduced": "reproduced", "not reproduced": "not", "mixed": "not"}
    items = "".join(f"<li><span class='{css.get(e['verdict'], 'untested')}'>{html.escape(e['verdict'])}</span>: "
                    f"{html.escape(e['published'])}. <i>{html.escape(e['evidence'])}.</i></li>" for e in entries)
    return f"<ul>{items}</ul>"


def _scale_note(results: dict[str, Any]) -> str:
    models = results["models"]
    trained = [m["label"] for m in models if m.get("training") and not m.get("planted")]
    given = [m["label"] for m in models if not m.get("training") and not m.get("planted")]
    planted = [m["label"] for m in models if m.get("planted")]
    parts = [f"Measured on <b>{html.escape(str(results['provenance']['dataset']))}</b>, "
             f"{models[0]['num_images'] if models else 0} evaluation images."]
    if trained:
        epochs = {(m["training"] or {}).get("epochs") for m in models if m.get("training")}
        parts.append(f"Trained here: {html.escape(', '.join(trained))} ({', '.join(map(str, epochs))} epochs).")
    if given:
        parts.append(f"Given or preset models: {html.escape(', '.join(given))}; those whose spec starts with "
                     "<code>timm:</code> and show <i>random</i> weights are randomly initialised: they show that "
                     "the census runs on each geometry, not findings.")
    if planted:
        parts.append(f"Constructed: {html.escape(', '.join(planted))} (planted outliers).")
    parts.append("Artifacts need large models trained long; a small model trained for minutes is not expected to "
                 "grow them, and this report claims only what these runs show.")
    return " ".join(parts)


def build_report(out: str | Path) -> Path:
    """Build ``report.html`` (figures embedded) from the study in ``out``; returns its path."""
    out = Path(out)
    results_file = out / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{results_file} does not exist; run the study first (vitscope study registers)")
    results = json.loads(results_file.read_text())
    paths = make_figures(out, results)
    checks = detector_check(results["rows"], results["models"])
    sections = [
        "<h1>Registers study: high-norm tokens across architectures, and what registers change</h1>",
        f'<p class="note">{_scale_note(results)}</p>', TERMS,
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
    sections += [f"<h3>{html.escape(k[5:])}</h3>" + image(p, k) for k, p in paths.items() if k.startswith("maps:")]
    sections += ["<h2>Where high-norm tokens sit</h2>", table(_location(results)),
                 "<h2>What attends to them</h2>", table(_attention(results))]
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
    return atomic_write_bytes(out / "report.html", page("vitscope registers study", sections))
