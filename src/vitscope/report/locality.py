"""The locality study's report: figures (PNG) and one self-contained ``report.html``, built only from the
study's own files (``results.json`` and each run's ``attention_examples.safetensors``)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from vitscope.analyze.locality import DEFINITIONS
from vitscope.files import atomic_write_bytes
from vitscope.metrics import early_layers
from vitscope.report import figures
from vitscope.studies.locality_results import PAPER
from vitscope.train.protocols import parse_protocol

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:1em 0}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.6em 1em}code{background:#f3f3f3;padding:0 3px}"""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if value != value else f"{value:.4f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return html.escape(str(value))


def _table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p>(none)</p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _stack(runs: list[dict[str, Any]], metric: str) -> np.ndarray:
    """(layers, heads x seeds) values of one condition, heads of all seeds side by side."""
    return np.concatenate([np.asarray(r[metric], dtype=float) for r in runs], axis=1)


def make_figures(out: Path, results: dict[str, Any]) -> dict[str, Path]:
    """Write every figure of the report into ``out/figures`` and return their paths."""
    fig_dir = out / "figures"
    runs = results["runs"]
    conditions = list(dict.fromkeys(r["condition"] for r in runs))
    by_cond = {c: [r for r in runs if r["condition"] == c] for c in conditions}
    space = {c: (_stack(rs, "mad"), _stack(rs, "entropy")) for c, rs in by_cond.items()}
    paths = {
        "behaviour": figures.behaviour_space(space, fig_dir / "behaviour_space.png"),
        "mad": figures.per_layer({c: _stack(rs, "mad") for c, rs in by_cond.items()}, "MAD (normalized)",
                                 fig_dir / "mad_per_layer.png"),
        "entropy": figures.per_layer({c: _stack(rs, "entropy") for c, rs in by_cond.items()}, "normalised entropy",
                                     fig_dir / "entropy_per_layer.png"),
    }
    points = [{"condition": row["condition"], "accuracy": row["accuracy_mean"], "accuracy_std": row["accuracy_std"],
               "min_early_mad": row["min_early_mad_mean"], "min_early_mad_std": row["min_early_mad_std"],
               "cutmix": "cutmix" in parse_protocol(row["condition"])} for row in results["summary"]]
    if all(p["accuracy"] is not None for p in points):
        paths["accuracy"] = figures.accuracy_vs_locality(points, fig_dir / "accuracy_vs_locality.png")
    for condition, rs in by_cond.items():
        example = out / "runs" / condition / f"seed-{rs[0]['seed']}" / "attention_examples.safetensors"
        if not example.is_file():
            continue
        tensors = load_file(str(example))
        for i in range(min(2, len(tensors["images"]))):
            maps = {"layer 1": tensors["layer1"][i], "layer 2": tensors["layer2"][i]}
            image = tensors["images"][i].transpose(1, 2, 0)
            paths[f"examples:{condition}:{i}"] = figures.attention_examples(
                image, maps, tuple(rs[0]["grid_size"]), rs[0]["num_prefix_tokens"],
                fig_dir / f"attention_{condition}_{i}.png")
    return paths


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _scale_note(results: dict[str, Any]) -> str:
    runs = results["runs"]
    train = runs[0]["train_config"]
    layers = len(runs[0]["layers"])
    early = [i + 1 for i in early_layers(layers, results["provenance"]["config"].get("early_layers"))]
    return (f"Measured on <b>{html.escape(results['provenance']['dataset'])}</b> with model "
            f"<code>{html.escape(train['model'])}</code> {html.escape(json.dumps(train['model_options']))}, "
            f"{train['epochs']} epochs, batch {train['batch_size']}, {len(runs)} runs "
            f"({_count(len({r['condition'] for r in runs}), 'condition')} x "
            f"{_count(len({r['seed'] for r in runs}), 'seed')}), "
            f"each analysed on {runs[0]['num_images']} evaluation images. Early layers: {early}. "
            "The paper's numbers come from CIFAR-100 at full scale; this report claims only what this run shows.")


def _verdicts(results: dict[str, Any]) -> str:
    lines = []
    for claim in results["claims"]:
        if claim["measure"] != "min_early_mad" or "cutmix" not in claim["claim"]:
            continue
        direction = "lower" if claim["difference"] < 0 else "higher"
        sure = "the 95% interval excludes zero" if claim["interval_excludes_zero"] else "the 95% interval includes zero"
        seeds_note = ("; with a single run per side the interval reflects head sampling only, not training "
                      "randomness: use several seeds" if min(claim["runs_with"], claim["runs_without"]) < 2 else "")
        lines.append(f"<li>{html.escape(claim['claim'])}: minimum early-layer MAD {direction} by "
                     f"{abs(claim['difference']):.4f} ({sure}{seeds_note}). For scale, the paper's gap between "
                     "conditions with and without CutMix is about 0.2.</li>")
    if not lines:
        return "<p>No CutMix comparison is possible with these conditions.</p>"
    return "<ul>" + "".join(lines) + "</ul>"


def build_report(out: str | Path) -> Path:
    """Build ``report.html`` (figures embedded) from the study in ``out``; returns its path."""
    out = Path(out)
    results_file = out / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{results_file} does not exist; run the study first (vitscope study locality)")
    results = json.loads(results_file.read_text())
    paths = make_figures(out, results)
    settings = results["runs"][0]["train_config"]
    claims = [{k: c[k] for k in ("claim", "measure", "with", "without", "difference", "ci95_low", "ci95_high",
                                 "runs_with", "runs_without")} for c in results["claims"]]
    per_run = [{"condition": r["condition"], "seed": r["seed"], "accuracy": r["accuracy"],
                "min early MAD": float(np.nanmin(np.asarray(r["mad"], dtype=float)[
                    early_layers(len(r["layers"]), results["provenance"]["config"].get("early_layers"))])),
                "skipped (image, head)": int(np.sum(r["skipped"]))} for r in results["runs"]]
    examples = "".join(_img(p, k) for k, p in paths.items() if k.startswith("examples:"))
    sections = [
        "<h1>Locality study: does the training protocol make early layers attend locally?</h1>",
        f'<p class="note">{_scale_note(results)}</p>',
        "<h2>What this run shows</h2>", _verdicts(results),
        f"<p>Paper (arXiv 2605.16390): {html.escape(PAPER['cutmix_min_early_mad'])}; "
        f"{html.escape(PAPER['accuracy'])}.</p>",
        "<h2>Claims checked</h2><p>Differences are (with) - (without); 95% bootstrap intervals resample seeds "
        "and, for MAD, the heads of the early layers.</p>", _table(claims),
        "<h2>Summary per condition</h2>",
        _table(results["summary"], ["condition", "seeds", "accuracy_mean", "accuracy_std", "min_early_mad_mean",
                                    "min_early_mad_std"]),
        "<h2>Runs</h2>", _table(per_run),
        "<h2>MAD-entropy behaviour space</h2>", _img(paths["behaviour"], "behaviour space"),
        "<h2>Per layer</h2>", _img(paths["mad"], "MAD per layer"), _img(paths["entropy"], "entropy per layer"),
    ]
    if "accuracy" in paths:
        sections += ["<h2>Accuracy against early-layer locality</h2>", _img(paths["accuracy"], "accuracy vs MAD")]
    sections += ["<h2>Attention in layers 1-2 (CLS and the centre patch, per head)</h2>", examples or "<p>(none)</p>",
                 "<h2>Definitions</h2>", _table([{"quantity": k, "definition": v} for k, v in DEFINITIONS.items()]),
                 "<h2>Settings</h2>", _table([{"setting": k, "value": v} for k, v in settings.items()]),
                 "<h2>Provenance</h2>",
                 _table([{"field": k, "value": v} for k, v in results["provenance"].items() if k != "config"])]
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>vitscope locality study</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>")
    return atomic_write_bytes(out / "report.html", page.encode())
