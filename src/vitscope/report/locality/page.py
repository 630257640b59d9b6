"""The locality study's report: figures (PNG) and one self-contained ``report.html``, built only from the
study's own files (``results.json`` and each run's ``attention_examples.safetensors``).

The report opens with a verdict per claim of the registry (``vitscope.claims.locality``, judged by
``studies.locality.verdicts``), each once, with its interval, its size beside the paper's, what the run's scale
differs in, and the readings the seed leaves open; it draws the uniform-attention reference on every MAD and entropy
axis, and lists every run's settings. It reads the study's ``LocalityResults`` by attribute.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from vitscope.analyze.locality import DEFINITIONS
from vitscope.atomic_io import atomic_write_bytes
from vitscope.claims import claim
from vitscope.metrics import early_layers
from vitscope.report.figures import locality as figures
from vitscope.report.html import image, index_link, page, study_results, table
from vitscope.report.locality import claims as sections
from vitscope.report.openings import locality_opening as opening
from vitscope.report.render import trusted
from vitscope.studies.locality.readings import MAD_READINGS, layer_text
from vitscope.studies.locality.records import LocalityRun, as_runs
from vitscope.studies.locality.results import LocalityResults, read_results
from vitscope.studies.locality.scope import DATASETS
from vitscope.studies.locality.verdicts import has_cutmix
from vitscope.train.protocols import parse_protocol

EXAMPLE_IMAGES = 2  # example images per condition in the report
BAND = "min-max over heads and seeds"  # what the per-layer figures shade
# settings that act only when the run's protocol has the component (vitscope.train.protocols.Protocol)
PROTOCOL_SETTINGS = {"label_smoothing": "labelsmoothing", "cutmix_alpha": "cutmix"}


def _stack(runs: list[LocalityRun], metric: str) -> np.ndarray:
    """(layers, heads x seeds) values of one condition, heads of all seeds side by side."""
    return np.concatenate([np.asarray(r.measure(metric), dtype=float) for r in runs], axis=1)


def _early(results: LocalityResults) -> list[int]:
    return early_layers(results.runs[0].num_layers, results.early_layers)


def _uniform(results: LocalityResults) -> float:
    return figures.uniform_mad(tuple(results.runs[0].grid_size))


def _example_maps(tensors: dict[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    return {"layer 1": tensors["layer1"][index], "layer 2": tensors["layer2"][index]}


def _shared_vmax(examples: dict[str, tuple[LocalityRun, dict[str, np.ndarray]]]) -> float | None:
    """The largest attention probability to a patch key in the example maps the report shows."""
    peaks = [float(np.max(layer[..., run.num_prefix_tokens:]))
             for run, tensors in examples.values() for i in range(min(EXAMPLE_IMAGES, len(tensors["images"])))
             for layer in _example_maps(tensors, i).values()]
    return max(peaks, default=None)


def make_figures(out: Path, results: LocalityResults) -> dict[str, Path]:
    """Write every figure of the report into ``out/figures`` and return their paths."""
    fig_dir = out / "figures"
    runs = results.runs
    uniform = _uniform(results)
    conditions = list(dict.fromkeys(r.condition for r in runs))
    by_cond = {c: [r for r in runs if r.condition == c] for c in conditions}
    space = {c: (_stack(rs, "mad"), _stack(rs, "entropy")) for c, rs in by_cond.items()}
    paths = {
        "behaviour": figures.behaviour_space(space, fig_dir / "behaviour_space.png", uniform=uniform),
        "mad": figures.per_layer({c: _stack(rs, "mad") for c, rs in by_cond.items()}, "MAD (normalized)",
                                 fig_dir / "mad_per_layer.png", reference=uniform, band=BAND,
                                 title="mean attention distance per layer"),
        "entropy": figures.per_layer({c: _stack(rs, "entropy") for c, rs in by_cond.items()}, "normalised entropy",
                                     fig_dir / "entropy_per_layer.png", reference=1.0, band=BAND,
                                     title="normalised attention entropy per layer"),
    }
    points = [{"condition": row["condition"], "accuracy": row["accuracy_mean"], "accuracy_std": row["accuracy_std"],
               "min_early_mad": row["min_early_mad_mean"], "min_early_mad_std": row["min_early_mad_std"],
               "cutmix": has_cutmix(row["condition"])} for row in results.summary]
    if all(p["accuracy"] is not None for p in points):
        paths["accuracy"] = figures.accuracy_vs_locality(points, fig_dir / "accuracy_vs_locality.png", uniform=uniform)
    examples = {}
    for condition, rs in by_cond.items():
        example = out / "runs" / condition / f"seed-{rs[0].seed}" / "attention_examples.safetensors"
        if example.is_file():
            examples[condition] = (rs[0], load_file(str(example)))
    vmax = _shared_vmax(examples)  # one colour scale for every example figure, so that conditions compare by eye
    for condition, (run, tensors) in examples.items():
        for i in range(min(EXAMPLE_IMAGES, len(tensors["images"]))):
            paths[f"examples:{condition}:{i}"] = figures.attention_examples(
                tensors["images"][i].transpose(1, 2, 0), _example_maps(tensors, i), tuple(run.grid_size),
                run.num_prefix_tokens, fig_dir / f"attention_{condition}_{i}.png",
                title=f"{condition} (seed {run.seed}), image {i + 1}", vmax=vmax)
    return paths


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _scale_note(results: LocalityResults) -> str:
    runs = results.runs
    train = runs[0].train_config
    epochs = sorted({r.train_config["epochs"] for r in runs})
    early = [i + 1 for i in _early(results)]
    return (f"Measured on <b>{html.escape(DATASETS.get(results.dataset, results.dataset))}</b> with model "
            f"<code>{html.escape(train['model'])}</code>"
            f"{' ' + html.escape(json.dumps(train['model_options'])) if train['model_options'] else ''}, "
            f"{' or '.join(_count(e, 'epoch') for e in epochs)}, batch {train['batch_size']}{_images_note(runs)}, "
            f"{len(runs)} runs "
            f"({_count(len({r.condition for r in runs}), 'condition')} x "
            f"{_count(len({r.seed for r in runs}), 'seed')}), "
            f"each analysed on {runs[0].num_images} evaluation images. Early layers: {layer_list(early)}; MAD: "
            f"{MAD_READINGS['mad']} (the stated reading; the seed fixes neither). Each verdict names the scale it "
            "holds for beside the paper's; this report claims only what this run shows.")


def _images_note(runs: list[LocalityRun]) -> str:
    """How many training images the runs used, and per epoch when the last partial batch was left out."""
    total, per_epoch = runs[0].train_images, runs[0].train_images_per_epoch
    if total is None:
        return ""
    if per_epoch is None or per_epoch == total:
        return f", {total} training images"
    return (f", {total} training images of which each epoch trains on {per_epoch} (full batches; the "
            f"{total - per_epoch} left over change with each epoch's shuffle)")


def layer_list(layers: list[int]) -> str:
    """Layer numbers as a reader writes them: '1', '1 and 2', '1-3', '1, 3 and 5'."""
    return layer_text(layers).removeprefix("layers ").removeprefix("layer ")


def effective_config(config: dict[str, Any], condition: str) -> dict[str, Any]:
    """A run's config as it acted: a protocol setting whose component the condition lacks reads 'off'."""
    try:
        components = parse_protocol(condition)
    except ValueError:
        return dict(config)
    return {k: (v if k not in PROTOCOL_SETTINGS or PROTOCOL_SETTINGS[k] in components else "off")
            for k, v in config.items()}


def _uniform_note(results: LocalityResults) -> str:
    """A plain warning when the early layers of every condition attend (almost) uniformly."""
    early, uniform = _early(results), _uniform(results)
    flat = []
    for row in results.summary:
        mad = np.nanmean([row[f"mad_layer{i + 1}_mean"] for i in early])
        entropy = np.nanmean([row[f"entropy_layer{i + 1}_mean"] for i in early])
        flat.append(abs(mad - uniform) < 0.03 and entropy > 0.95)
    if not all(flat):
        return ""
    return (f"<p class='note'>In every condition the early layers attend almost uniformly (mean MAD within 0.03 of "
            f"the uniform-attention value {uniform:.4f}, normalised entropy above 0.95): at this scale the models "
            "have not learned spatial attention patterns, so a locality effect cannot show. Train longer or on "
            "more data (the paper preset) before reading the MAD comparisons.</p>")


def _settings(results: LocalityResults | dict[str, Any]) -> str:
    """Settings shared by every run in one table, then the settings that differ, per run."""
    runs = as_runs(results["runs"]) if isinstance(results, dict) else results.runs
    configs = [effective_config(r.train_config, r.condition) for r in runs]
    keys = list(dict.fromkeys(k for c in configs for k in c))
    shared = [k for k in keys if all(json.dumps(c.get(k)) == json.dumps(configs[0].get(k)) for c in configs)]
    varying = [k for k in keys if k not in shared]
    per_run = [{"run": f"{r.condition} seed {r.seed}", **{k: c.get(k) for k in varying}}
               for r, c in zip(runs, configs, strict=True)]
    return (f"<h3>Shared by all {len(configs)} runs</h3>"
            + table([{"setting": k, "value": configs[0].get(k)} for k in shared])
            + "<h3>Per run</h3>" + table(per_run, ["run", *varying]))


def _subset(run: LocalityRun) -> str:
    selection = run.eval_subset
    if not selection:
        return f"all {run.num_images}"
    return f"{selection['count']} of {selection['of']} ({selection['method']}, seed {selection['seed']})"


def _provenance(results: LocalityResults) -> list[dict[str, Any]]:
    seeds = sorted({r.seed for r in results.runs})
    rows = []
    for key, value in results.provenance.items():
        if key == "config" or value in ({}, []):
            continue
        if key == "seed" and value is None:
            value = f"per run: {', '.join(map(str, seeds))}"
        rows.append({"field": key, "value": value})
    return rows


def _per_run(results: LocalityResults, early: list[int]) -> list[dict[str, Any]]:
    rows = []
    for r in results.runs:
        row = {"condition": r.condition, "seed": r.seed, "accuracy": r.accuracy,
               "min early MAD": sections.min_early(r.mad, early)}
        if r.mad_cls_at_zero:
            row["min early MAD, CLS at distance 0"] = sections.min_early(r.mad_cls_at_zero, early)
        rows.append(row | {"skipped (image, head)": int(np.sum(r.skipped)) if r.skipped else 0,
                           "evaluation images": _subset(r)})
    return rows


def build_report(out: str | Path) -> Path:
    """Build ``report.html`` (figures embedded) from the study in ``out``; returns its path."""
    out = Path(out)
    results = read_results(study_results(out, "locality"))
    paths = make_figures(out, results)
    early = _early(results)
    summary_columns = ["condition", "seeds", "accuracy_mean", "accuracy_std", "min_early_mad_mean",
                       "min_early_mad_std", *(["min_early_mad_cls_at_zero_mean", "min_early_mad_cls_at_zero_std"]
                                              if "min_early_mad_cls_at_zero_mean" in results.summary[0] else []),
                       "early_entropy_mean"]
    summary = [row | {"early_entropy_mean": float(np.nanmean([row[f"entropy_layer{i + 1}_mean"] for i in early]))}
               for row in results.summary]
    examples = "".join(image(p, k) for k, p in paths.items() if k.startswith("examples:"))
    l3 = claim("L3")
    sections_html = [
        index_link(out),
        "<h1>Locality study: does the training protocol make early layers attend locally?</h1>",
        opening(results),
        f'<p class="note">{_scale_note(results)}</p>',
        "<h2>What this run shows</h2>", sections.verdicts(results, _uniform_note(results)),
        "<h2>Claims checked</h2><p>Each registry claim once (<code>vitscope.claims.locality</code>); differences "
        "are a - b, one value per seed (for MAD, each seed's own minimum over its early heads); 95% Welch "
        "t-intervals over seeds (90% for an equivalence); a separation shows its closest pair.</p>",
        sections.claims_table(results),
        "<h2>The readings the seed leaves open</h2><p>The seed says neither how MAD treats CLS nor which layers "
        "are early. Each claim is judged again under the other readings, each with its own precondition; the "
        "verdict above uses the stated one.</p>", sections.readings_table(results),
        "<h2>Claims not judged</h2>", sections.qualitative(results),
        "<h2>Summary per condition</h2>", table(summary, summary_columns),
        "<h2>Runs</h2>", table(_per_run(results, early)),
        f"<h2>MAD-entropy behaviour space (claim L3, not judged)</h2><p>{html.escape(l3.statement)} (the paper; "
        f"a figure, no statistic judges it). Dashed lines: uniform attention (MAD {_uniform(results):.4f} "
        "normalised, entropy 1).</p>", image(paths["behaviour"], "behaviour space"),
        "<h2>Per layer</h2>", f"<p>Lines: the mean over heads (and seeds) per layer; shaded: the {BAND}; dashed: "
        "uniform attention.</p>", image(paths["mad"], "MAD per layer"), image(paths["entropy"], "entropy per layer"),
    ]
    if "accuracy" in paths:
        sections_html += ["<h2>Accuracy against early-layer locality</h2>",
                          image(paths["accuracy"], "accuracy vs MAD")]
    definitions = DEFINITIONS | {"mad_cls_at_zero": "MAD with each row's mass on CLS (and registers) counted at "
                                                    "distance 0: the raw patch mass, rows not renormalised "
                                                    "(renormalize=false)"}
    sections_html += ["<h2>Attention in layers 1-2 (CLS and the centre patch, per head)</h2><p>One colour scale "
                      "for every map of every condition.</p>", examples or "<p>(none)</p>",
                      "<h2>Definitions</h2>", table([{"quantity": k, "definition": v} for k, v in definitions.items()]),
                      "<h2>Settings</h2>", _settings(results),
                      "<h2>Provenance</h2>", table(_provenance(results))]
    return atomic_write_bytes(out / "report.html", page("vitscope locality study", trusted(sections_html)))
