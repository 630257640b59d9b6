"""The sparse-attention study's report: figures (PNG) and one self-contained ``report.html``, built only from the
study's own files (``results.json``, read as ``SparseResults``, and each run's ``examples.safetensors``); the
paper's numbers come from the claims registry (``vitscope.claims.sparse``)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from vitscope.atomic_io import atomic_write_bytes
from vitscope.claims import claim
from vitscope.report.html import image, index_link, page, study_results, table
from vitscope.report.openings import sparse_opening
from vitscope.report.render import trusted
from vitscope.report.sparse import figures as sparse_figures
from vitscope.report.sparse.verdicts import claims_section, differences_section
from vitscope.studies.models import loads_random_weights
from vitscope.studies.runner import RunSpec
from vitscope.studies.sparse.presets import COMMAND_LINES, COMPACT_GPU_HOURS, DEMO_LEFT_OUT, PAPER_GPU_HOURS
from vitscope.studies.sparse.results_file import SparseResults

Results = SparseResults | dict[str, Any]
# The paper's rows of the paper-style table: the registry claims that carry its numbers (S4 linear top-1 in %,
# S5-S7 mIoU per set), with the paper's name of each condition.
PAPER_ROWS = {"softmax": "CLS baseline", "entmax15": "entmax-1.5"}
PAPER_COLUMNS = {"S4": "linear_top1", "S5": "seg voc mIoU", "S6": "seg ade20k mIoU", "S7": "seg cityscapes mIoU"}

DEFINITIONS = {
    "linear_top1": "logistic regression (lr/weight-decay sweep on a held-out 20 % of the probe-training images, best "
                   "refitted), top-1 on the evaluation images, on DINO's ViT-S feature (the last four blocks' CLS "
                   "tokens concatenated; the setting linear_protocol) or the last layer's CLS alone; the other "
                   "protocol is the claim's second reading",
    "knn_top1": "weighted kNN (k = 20, temperature 0.07, DINO's vote) on the last layer's CLS token",
    "attention_zeros": "per layer and head, over patch queries and keys: the fraction of attention "
                       "probabilities that are exactly 0, averaged over query rows and images",
    "attention_support": "per layer and head: the number of patch keys with nonzero probability per patch query",
    "attention_mad / attention_entropy": "mean attention distance (normalized) and normalised entropy on "
                                         "renormalised patch rows, as in the locality study",
    "seg:NAME miou / depth:NAME rmse": "dense probes: batch norm + 1x1 linear head on the patch-token map "
                                       "(optionally with CLS concatenated), bilinear upsampling; mIoU from one "
                                       "confusion matrix; RMSE the mean of per-image RMSE",
    "pib": "Point-in-Box (vitscope's definition; the seed defines none): % of images whose top patch by CLS "
           "attention (mean over heads) has its centre in a box; chance = mean fraction of patch centres in boxes",
    "diffusion_top1": "vitscope's semantic diffusion (a) (the seed defines no measure): top-1 on held-out images of "
                      "an image-class logistic regression "
                      "trained on single background patch tokens (centre outside every object box or mask)",
    "diffusion_cosine": "vitscope's semantic diffusion (b): mean cosine similarity between background patch tokens "
                        "and CLS",
    "verdict": "each claim of the registry (vitscope.claims.sparse) judged once by the one rule "
               "(vitscope.stats.compare), one value per seed: a difference claim is reproduced when the 95 % interval "
               "excludes 0 in the paper's direction and the difference reaches half the paper's effect, not "
               "reproduced when the whole interval lies below half of it, inconclusive otherwise and always with "
               "fewer than 2 seeds per side; a direction claim needs only the interval to exclude 0 its way",
}


def _summary_lookup(results: SparseResults) -> dict[tuple, dict[str, Any]]:
    return {(r["model"], r["layer"], r["layer_kind"], r["group"], r["metric"], r.get("with_cls")): r
            for r in results.summary}


def shown_names(results: Results) -> dict[str, str]:
    """condition -> its name in figures: a given model with random weights says so (``label (random weights)``)."""
    return {r["condition"]: f"{r['condition']} (random weights)" for r in SparseResults.coerce(results).runs
            if loads_random_weights((r.get("source") or {}).get("given"))}


def _shown(name: str, shown: dict[str, str]) -> str:
    """A curve name with its model part as ``shown_names`` shows it (variant suffixes kept)."""
    model = sparse_figures.model_of(name)
    return name.replace(model, shown[model], 1) if model in shown else name


def _curves(results: Results, metric: str, kind: str, group: str, with_cls: bool | None = None,
            suffix: str = "") -> dict[str, tuple]:
    """model -> (layers, mean, std) of one metric from the summary (``suffix`` appended to model names, which are
    shown as ``shown_names`` says)."""
    results = SparseResults.coerce(results)
    out: dict[str, list] = {}
    shown = shown_names(results)
    for r in results.summary:
        if r["metric"] == metric and r["layer_kind"] == kind and r["group"] == group and (
                with_cls is None or r.get("with_cls") == with_cls or (r.get("with_cls") is None and not with_cls)):
            out.setdefault(_shown(r["model"], shown) + suffix, []).append((r["layer"], r["mean"], r["std"]))
    return {m: tuple(np.asarray(v, dtype=float) for v in zip(*sorted(points), strict=True))
            for m, points in out.items()}


def make_figures(out: Path, results: SparseResults) -> dict[str, Path]:
    """Every figure of the report, written into ``out/figures``."""
    fig_dir = out / "figures"
    paths = {
        "diffusion": sparse_figures.layer_curves(
            {"diffusion_top1": _curves(results, "diffusion_top1", "token", "background"),
             "diffusion_cosine": _curves(results, "diffusion_cosine", "token", "background")},
            ["diffusion_top1", "diffusion_cosine"], fig_dir / "semantic_diffusion.png",
            "semantic diffusion per token layer (lower = less global semantics in background tokens)"),
        "sparsity": sparse_figures.layer_curves(
            {m: _curves(results, m, "attention", "heads") for m in ("attention_zeros", "attention_support")},
            ["attention_zeros", "attention_support"], fig_dir / "sparsity.png",
            "attention sparsity per layer (mean over heads)"),
        "locality": sparse_figures.layer_curves(
            {m: _curves(results, m, "attention", "heads") for m in ("attention_mad", "attention_entropy")},
            ["attention_mad", "attention_entropy"], fig_dir / "locality.png", "MAD and entropy per layer"),
    }
    seg = sorted({r["group"] for r in results.summary if r["group"] and str(r["group"]).startswith("seg:")})
    layerwise = {}
    if seg:
        layerwise["mIoU " + seg[0]] = (_curves(results, "miou", "token", seg[0], False, " (patches)")
                                       | _curves(results, "miou", "token", seg[0], True, " (patches + CLS)"))
    pib = _curves(results, "pib", "attention", "attention")
    if pib:
        layerwise["Point-in-Box (%)"] = pib
    if layerwise:
        paths["layerwise"] = sparse_figures.layer_curves(layerwise, list(layerwise), fig_dir / "layerwise.png",
                                                         "layer-wise dense probe and Point-in-Box")
    examples = {}
    for run in results.runs:
        if run["condition"] in examples:
            continue
        file = RunSpec(run["condition"], run["seed"]).folder(out) / "examples.safetensors"
        if file.is_file():
            examples[run["condition"]] = (run, load_file(str(file)))
    if examples:
        first = next(iter(examples.values()))[1]
        grids = {c: tuple(r["grid_size"]) for c, (r, _) in examples.items()}
        shown = shown_names(results)
        same_grid = {shown.get(c, c): t["patches_last"] for c, (r, t) in examples.items()
                     if "patches_last" in t and grids[c] == next(iter(grids.values()))}
        if same_grid:
            paths["pca"] = sparse_figures.pca_maps(first["images"], same_grid, next(iter(grids.values())),
                                                   fig_dir / "pca_maps.png")
        for i in range(min(2, len(first["images"]))):
            for layer in ("first", "last"):
                maps = {c: t[f"attention_{layer}"][i] for c, (r, t) in examples.items()
                        if r["num_prefix_tokens"] > r["num_registers"]}
                if not maps:
                    continue
                run0 = next(iter(examples.values()))[0]
                prefix = {c: r["num_prefix_tokens"] for c, (r, _) in examples.items()}
                if len(set(prefix.values())) > 1:  # registers change the token count: one figure per model
                    for c, m in maps.items():
                        paths[f"attention:{layer}:{i}:{c}"] = sparse_figures.attention_heads(
                            first["images"][i], {shown.get(c, c): m}, grids[c], prefix[c],
                            fig_dir / f"attn_{layer}_{i}_{c}.png", layer=f"{layer} layer, image {i + 1}")
                else:
                    paths[f"attention:{layer}:{i}"] = sparse_figures.attention_heads(
                        first["images"][i], {shown.get(c, c): m for c, m in maps.items()}, tuple(run0["grid_size"]),
                        run0["num_prefix_tokens"], fig_dir / f"attn_{layer}_{i}.png",
                        layer=f"{layer} layer, image {i + 1}")
    return paths


def _pm(mean: float, std: float, scale: float = 100.0, seeds: int = 1) -> str:
    if mean != mean:
        return "n/a"
    return f"{mean * scale:.2f}" + (f" ± {std * scale:.2f}" if seeds > 1 else "")


def _paper_values() -> dict[str, dict[str, float]]:
    """condition -> column -> the paper's number, from the registry (top-1 in %, mIoU in points)."""
    out: dict[str, dict[str, float]] = {c: {} for c in PAPER_ROWS}
    for claim_id, column in PAPER_COLUMNS.items():
        values = claim(claim_id).paper.values
        for condition, name in PAPER_ROWS.items():
            out[condition][column] = values[name]
    return out


def paper_setting() -> str:
    """Where the paper measured its numbers, from the registry."""
    paper = claim("S4").paper
    return f"paper: {paper.dataset}, {paper.model}, {paper.scale} (arXiv 2605.23868)"


def paper_table(results: Results) -> list[dict[str, Any]]:
    """Rows: our conditions (mean ± std over seeds, in %) and the paper's numbers, each labelled with its
    setting. Dense sets we did not measure read 'not measured'."""
    results = SparseResults.coerce(results)
    lookup = _summary_lookup(results)
    conditions = results.conditions()
    seg_sets = [c.split()[1] for c in PAPER_COLUMNS.values() if c.startswith("seg ")]
    seeds = results.seeds_per_condition()
    depth = results.runs[0]["depth"]
    groups = {r["group"] for r in results.summary if isinstance(r["group"], str)}
    ours_seg = sorted(g.split(":", 1)[1] for g in groups if g.startswith("seg:") and g[4:] not in seg_sets)
    ours_depth = sorted(g.split(":", 1)[1] for g in groups if g.startswith("depth:"))
    protocol = results.runs[0]["image"].get("linear_protocol", "last-cls")
    linear_group = "dino-last4" if protocol == "dino-last4" else "cls"
    ours_setting = f"ours: {results.provenance.get('dataset')}, {_model_text(results)}, {seeds} seed(s)"
    rows = []
    for c in conditions:
        row: dict[str, Any] = {"condition": c, "setting": ours_setting}
        for metric, group in (("linear_top1", linear_group), ("knn_top1", "cls")):
            found = lookup.get((c, depth, "token", group, metric, None))
            row[metric] = _pm(found["mean"], found["std"], seeds=found["seeds"]) if found else "n/a"
        for name in seg_sets + ours_seg:
            found = lookup.get((c, depth, "token", f"seg:{name}", "miou", False))
            row[f"seg {name} mIoU"] = _pm(found["mean"], found["std"], 1.0, found["seeds"]) if found \
                else "not measured"  # the dense probes report mIoU in percent already
        for name in ours_depth:
            found = lookup.get((c, depth, "token", f"depth:{name}", "rmse", True))
            row[f"depth {name} RMSE (with CLS)"] = _pm(found["mean"], found["std"], 1.0, found["seeds"]) \
                if found else "n/a"
        rows.append(row)
    for c, numbers in _paper_values().items():
        row = {"condition": c, "setting": paper_setting(), "linear_top1": f"{numbers['linear_top1']:.2f}",
               "knn_top1": "not reported"}
        for name in seg_sets:
            row[f"seg {name} mIoU"] = f"{numbers[f'seg {name} mIoU']:.2f}"
        for name in ours_seg:
            row[f"seg {name} mIoU"] = "-"
        for name in ours_depth:
            row[f"depth {name} RMSE (with CLS)"] = "-"
        rows.append(row)
    return rows


def _model_text(results: SparseResults) -> str:
    trained = [r["source"]["trained"] for r in results.runs if "trained" in r.get("source", {})]
    if not trained:
        return "given models"
    t = trained[0]
    return f"{t['model']}, DINO {t['epochs']} epochs on {t['dataset']}"


def zero_fractions(results: Results) -> dict[str, list[float]]:
    """Per condition: the fraction of exactly-zero attention probabilities per layer (mean over heads and
    seeds), in [0, 1]."""
    per: dict[str, list[np.ndarray]] = {}
    for run in SparseResults.coerce(results).runs:
        per.setdefault(run["condition"], []).append(np.asarray(run["attention"]["zeros"], dtype=float))
    return {c: np.nanmean(np.stack(z), axis=(0, 2)).tolist() for c, z in per.items()}


def zero_line(results: Results) -> str:
    """One sentence: exact zeros per layer of each condition, softmax's (0 % by construction) beside them."""
    parts = [f"<b>{html.escape(c)}</b> " + ", ".join(f"{z:.0%}" for z in zeros)
             for c, zeros in zero_fractions(results).items()]
    return ("Exact zeros in the attention maps, per layer 1..L (mean over heads and seeds): " + "; ".join(parts)
            + ". Softmax never gives an exact zero (claim S11 asks it of every entmax-1.5 run).")


def left_out(results: Results) -> str:
    """For the demo: the measurements it leaves out because they cannot discriminate at its scale, and why."""
    results = SparseResults.coerce(results)
    if results.settings.get("preset") != "demo":
        return ""
    shown = {r["group"] for r in results.summary if isinstance(r.get("group"), str)}
    missing = {name: why for name, why in DEMO_LEFT_OUT.items()
               if not any(g.startswith("depth:") for g in shown) or name != "depth"}
    if any(r.get("metric") == "pib" for r in results.summary):
        missing.pop("Point-in-Box", None)
    items = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in missing.items())
    return f"<p>Left out of the demo, because at this scale they cannot discriminate:</p><ul>{items}</ul>" \
        if items else ""


def _scale_note(results: SparseResults) -> str:
    settings = results.settings
    runs = results.runs
    text = (f"Preset <b>{html.escape(settings['preset'])}</b>: {html.escape(_model_text(results))}; "
            f"{len(runs)} measured backbones; probes fitted on {runs[0]['probe_train_images']} training images "
            f"and measured on {runs[0]['eval_images']} evaluation images. ")
    if settings["preset"] == "demo":
        text += ("This is the demo: a 4-block, 64-wide ViT trained for a few DINO epochs on synthetic scenes. "
                 "It shows the pipeline and what sparse attention does to the attention maps (exact zeros, "
                 "support size); a model this small, trained this briefly, cannot show the paper's effect sizes: "
                 "each verdict below says how its effect compares in size with the paper's and at what scale it "
                 "was measured.")
    else:
        text += "The paper's numbers come from ImageNet-1k at full scale; this report claims only what this run shows."
    flat = [r["condition"] for r in runs if (r.get("normaliser") or "softmax") != "softmax"
            and float(np.nanmean(np.asarray(r["attention"]["zeros"], dtype=float))) == 0.0]
    if flat:
        text += (f" <b>{html.escape(', '.join(flat))}</b> produced no exact zeros: after training this short its "
                 "attention logits are still nearly flat, so every key stays in the support and the normaliser "
                 "behaves almost like softmax; train longer (more epochs or the compact preset) before reading "
                 "anything into its comparison with softmax.")
    return text


def settings_rows(results: SparseResults) -> list[dict[str, Any]]:
    """The study's settings; one left to the preset (None) shows the value the runs used, marked as the preset's."""
    trained = [r["source"]["trained"] for r in results.runs if "trained" in r.get("source", {})]
    rows = []
    for key, value in results.settings.items():
        used = {json.dumps(t.get(key)) for t in trained} if value is None else set()
        if value is None and len(used) == 1 and key in trained[0]:
            value = f"{json.loads(used.pop())} (the preset's)"
        probe = {"probe_train_images": "probe_train_images", "probe_eval_images": "eval_images"}.get(key)
        if value is None and probe and results.runs and results.runs[0].get(probe) is not None:
            value = f"{results.runs[0][probe]} (the preset's)"
        rows.append({"setting": key, "value": json.dumps(value) if isinstance(value, dict | list) else value})
    return rows


def _runs_table(results: SparseResults) -> list[dict[str, Any]]:
    return [{"condition": r["condition"], "seed": r["seed"], "normaliser": r.get("normaliser"),
             "registers": r["num_registers"], "parameters": r["parameters"],
             "linear_top1": r["image"]["linear_top1"], "linear protocol": r["image"].get("linear_protocol", "last-cls"),
             "knn_top1": r["image"]["knn_top1"],
             "DINO kNN (training monitor)": ((r.get("training") or {}).get("eval") or {}).get("knn_top1"),
             "diffusion_top1 (last)": r["diffusion_last_layer"].get("top1"),
             "diffusion_cosine (last)": r["diffusion_last_layer"].get("cosine"),
             "zeros (mean)": float(np.nanmean(np.asarray(r["attention"]["zeros"], dtype=float)))}
            for r in results.runs]


def build_report(out: str | Path) -> Path:
    """Build ``report.html`` (figures embedded) from the study in ``out``; returns its path."""
    out = Path(out)
    results = SparseResults.from_json(study_results(out, "sparse"))
    paths = make_figures(out, results)
    attention = "".join(image(p, k) for k, p in paths.items() if k.startswith("attention:"))
    sections = [
        index_link(out),
        "<h1>Sparse attention against semantic diffusion</h1>", sparse_opening(results),
        f"<p><b>{zero_line(results)}</b></p>", left_out(results),
        f'<p class="note">{_scale_note(results)}</p>',
        "<h2>The paper's claims, judged</h2>", claims_section(results),
        "<h2>Paper-style table (top-1 and mIoU in %)</h2>",
        "<p>Our rows and the paper's rows are measured in different settings (each row says which); compare "
        "directions, not values. Segmentation: last layer, patch tokens only (with CLS in results.csv); depth: with "
        "CLS, as the paper's protocol; 'not measured': no such set given (--seg NAME=PATH).</p>",
        table(paper_table(results)),
        "<h2>Measured differences without a paper claim</h2>", differences_section(results),
        "<h2>Semantic diffusion per layer</h2>", image(paths["diffusion"], "semantic diffusion"),
        "<h2>Layer-wise segmentation mIoU and Point-in-Box</h2>",
        image(paths["layerwise"], "layer-wise") if "layerwise" in paths else "<p>(no segmentation set or boxes)</p>",
        "<h2>Attention sparsity per layer</h2>", image(paths["sparsity"], "sparsity"),
        "<h2>Attention locality per layer</h2>", image(paths["locality"], "locality"),
    ]
    if "pca" in paths:
        sections += ["<h2>PCA maps of last-layer patch tokens (first 3 components as RGB, per image)</h2>",
                     image(paths["pca"], "PCA maps")]
    sections += [
        "<h2>CLS attention per head (first and last layer; cyan = exactly zero)</h2>", attention or "<p>(none)</p>",
        "<h2>Runs</h2>", table(_runs_table(results)),
        "<h2>At full scale</h2>",
        f"<p>Estimated cost (our estimate, not a measurement): paper preset about {PAPER_GPU_HOURS['per_run_a100']} "
        f"A100 GPU-hours ({PAPER_GPU_HOURS['per_run_v100']} V100) per run, one run per condition and seed "
        f"({PAPER_GPU_HOURS['runs_default']} conditions by default); compact about "
        f"{COMPACT_GPU_HOURS['per_run_a100']} A100 GPU-hours per run.</p>",
        table([{"how": k, "command": v} for k, v in COMMAND_LINES.items()]),
        "<h2>Definitions</h2>", table([{"quantity": k, "definition": v} for k, v in DEFINITIONS.items()]),
        "<h2>Settings</h2>", table(settings_rows(results)),
        "<h2>Provenance</h2>",
        table([{"field": k, "value": v} for k, v in results.provenance.items() if k != "config"]),
    ]
    return atomic_write_bytes(out / "report.html", page("vitscope sparse-attention study", trusted(sections)))
