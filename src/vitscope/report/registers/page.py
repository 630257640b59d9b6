"""The registers study's report: figures (PNG) and one self-contained ``report.html``, built only from the study's
files (``results.json`` and each model's ``models/<label>/census.json`` and ``census.safetensors``)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from vitscope.atomic_io import atomic_write_bytes
from vitscope.report.figures.norms import high_norm_maps
from vitscope.report.html import image, index_link, page, table
from vitscope.report.openings import registers_opening
from vitscope.report.registers import figures as rf
from vitscope.report.registers import tables
from vitscope.report.registers.claims import ARTIFACT_TEST, claims_section
from vitscope.report.render import trusted
from vitscope.studies.registers.measured import model_groups
from vitscope.studies.registers.results import RegistersResults
from vitscope.studies.registers.study import load_census_tensors

TERMS = ("<p><b>Terms, used once and for all.</b> A <i>high-norm token</i> is a patch token whose L2 norm (block "
         "output, before the final norm) exceeds a threshold fixed on the detection layer and applied to every "
         "layer; CLS and registers are never candidates. An <i>outlier</i> is the statistical notion (the tail above "
         "a threshold, present in every model: a percentile threshold flags its percentage by construction). An "
         "<i>artifact</i> is the phenomenon of Darcet et al.: a separate high-norm mode of a few percent of "
         f"patches, tested here on each layer's own norms (vitscope's test, the seed names none): {ARTIFACT_TEST}. "
         "The census's <code>auto</code> threshold is that split. <i>Planted</i> outliers are "
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
    "image_top1": "logistic image classifier on CLS (all held-out images), and on CLS alone and CLS with the mean "
                  "high-norm token on the held-out images that have one (the same images for both)",
    "separate_mode": "1 when the layer's own patch-token norms have a separate high-norm mode (the test above)",
}


def make_figures(out: Path, results: RegistersResults) -> dict[str, Path]:
    """Write every figure of the report into ``out/figures`` and return their paths by key."""
    fig_dir, rows, paths = out / "figures", results.rows, {}
    specs = list(dict.fromkeys(r["threshold"] for r in tables.by(rows, metric="high_norm_fraction")))
    curves = {spec: {m["label"]: sorted((r["layer"], r["value"]) for r in tables.by(
        rows, model=m["label"], metric="high_norm_fraction", threshold=spec) if r.get("layer_kind") == "token")
        for m in results.models} for spec in specs}
    if curves:
        paths["fraction"] = rf.high_norm_fraction(curves, fig_dir / "high_norm_fraction.png")
    panels = {}
    images = None
    for m in results.models:
        label = m["label"]
        census = json.loads((out / "models" / label / "census.json").read_text())
        stages = {r["layer"]: r["stage"] for r in tables.by(rows, model=label) if r.get("stage") and "layer" in r}
        paths[f"hist:{label}"] = rf.norm_histograms(census["histograms"], census["thresholds"],
                                                    f"{tables.title(m)}: token norms per layer",
                                                    fig_dir / f"norms_{label}.png", stages=stages)
        tensors = {k: v.numpy() for k, v in load_census_tensors(out, label).items()}
        if "norm_maps" in tensors:
            shown = tensors["images"].transpose(0, 2, 3, 1)
            first = m["thresholds"][0]
            paths[f"maps:{label}"] = high_norm_maps(shown, tensors["norm_maps"], first["value"],
                                                    fig_dir / f"artifacts_{label}.png",
                                                    layer=first.get("detection_layer"), model=tables.title(m))
            if not m.get("planted"):  # every plain model, registers or not, on the same images
                images = shown if images is None else images
                panels[label] = (tensors["cls_attention_last"], tuple(m["tokens"]["patches"]["grid"]),
                                 m["tokens"]["num_prefix_tokens"])
    if panels:
        paths["attention"] = rf.cls_attention(images, panels, fig_dir / "cls_attention_registers.png")
    return paths


def _scale_note(results: RegistersResults) -> str:
    models = results.models
    groups = model_groups(models)
    given, trained, random, planted = groups["given"], groups["trained"], groups["random"], groups["planted"]
    parts = [f"Measured on <b>{html.escape(results.dataset)}</b>, "
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
    if results.settings.get("preset") == "demo":
        parts.append("The demo trains supervised runs only, to stay within its minutes; the same comparison under "
                     "the DINO objective is the <code>demo-dino</code> preset.")
    if given:
        parts.append(f"Given with their weights: {html.escape(', '.join(given))}.")
    if random:
        parts.append(f"With <i>random</i> weights (seeded initialisation): {html.escape(', '.join(random))}; they "
                     "show that the census runs on each geometry, not findings.")
    if planted:
        parts.append(f"Constructed: {html.escape(', '.join(planted))} (planted outliers).")
    parts.append("This report claims only what these runs show: a model trained here for minutes is no pretrained "
                 "model of the paper, and its verdicts say so in their scope." if trained else
                 "This report claims only what these runs show.")
    return " ".join(parts)


def build_report(out: str | Path) -> Path:
    """Build ``report.html`` (figures embedded) from the study in ``out``; returns its path."""
    out = Path(out)
    results_file = out / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{results_file} does not exist; run the study first (vitscope study registers)")
    raw = json.loads(results_file.read_text())
    results = RegistersResults.from_json(raw)
    paths = make_figures(out, results)
    checks = tables.detector_check(results.rows, results.models)
    sections = [
        index_link(out),
        "<h1>Registers study: high-norm tokens across architectures, and what registers change</h1>",
        registers_opening(raw), f'<p class="note">{_scale_note(results)}</p>', TERMS,
        "<h2>The reassessment's claims (seed 004): reproduced or not, per family</h2>",
        claims_section(results.claims),
    ]
    if checks:
        sections += ["<h2>Detector and probes on planted outliers</h2>", table(checks)]
    sections += ["<h2>Models</h2>", tables.model_table(results),
                 "<h2>Registers comparison (last layer)</h2>", tables.comparison(results)]
    if "fraction" in paths:
        sections += ["<h2>High-norm fraction per layer</h2><p>Each threshold is fixed on its detection layer and "
                     "applied to every layer (Swin and PVT-v2: one threshold per stage); whether a layer has a "
                     "separate mode is tested on that layer's own norms (the Models table).</p>",
                     image(paths["fraction"], "high-norm fraction per layer")]
    sections += ["<h2>Token norms (log scale)</h2>"] + [image(p, k) for k, p in paths.items() if k.startswith("hist:")]
    sections += ["<h2>Artifact maps (detection layer, first threshold; red: high-norm)</h2>"]
    titles = {m["label"]: tables.title(m) for m in results.models}
    sections += [f"<h3>{html.escape(titles.get(k[5:], k[5:]))}</h3>" + image(p, k) for k, p in paths.items()
                 if k.startswith("maps:")]
    sections += ["<h2>Where high-norm tokens sit</h2>", tables.location(results),
                 "<h2>What attends to them</h2><p>Measured, not judged: the seed makes no claim about attention.</p>",
                 tables.attention(results)]
    stages = tables.stages(results)
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
                 "backbone / chance level)</i>; held out: tokens (images for CLS, registers and the patch mean) per "
                 f"split. A value on fewer than {tables.MIN_HELD_OUT} held-out tokens reads <i>too few</i>: it is no "
                 "evidence. Position and pixel probes apply to patch tokens only (n/a otherwise).</p>",
                 tables.probe_tables(results),
                 "<h2>Definitions</h2>", table([{"quantity": k, "definition": v} for k, v in METRICS.items()]),
                 "<h2>Settings</h2>", table([{"setting": k, "value": json.dumps(v) if isinstance(v, dict | list)
                                              else v} for k, v in results.settings.items()]),
                 "<h2>Provenance</h2>", table([{"field": k, "value": v} for k, v in results.provenance.items()
                                               if k != "config"])]
    return atomic_write_bytes(out / "report.html", page("vitscope registers study", trusted(sections)))
