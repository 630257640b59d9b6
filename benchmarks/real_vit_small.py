"""Collect the real ViT-S/14 runs (``runs/real/``) into the results page's small JSON and figures.

    python benchmarks/real_vit_small.py [runs/real] [docs/results/real-vit-small]

Reads what the commands on ``docs/results/real-vit-small.md`` wrote (analyze locality/norms, probe
knn/linear/tokens/pca, study registers) and writes ``results.json`` beside the page: per-layer MAD and entropy,
per-layer token norms with the registers study's "separate high-norm mode" test of each layer, every probe
row with its Wilson 95 % interval, the registers study's judged claims, and each run's wall time from its provenance.
Figures named in ``FIGURES`` are copied as they are. Nothing is recomputed from images.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from vitscope.metrics.high_norm import no_mode_possible
from vitscope.stats import wilson_interval
from vitscope.studies.registers.results import RegistersResults
from vitscope.studies.registers.verdicts import artifact_layers

DATASETS = {"c10": "cifar10", "c100": "cifar100", "syn": "synthetic (texture cue, 224 px)"}
FIGURES = {  # run folder / file -> name on the page
    "loc-c10/behaviour_space.png": "behaviour_space_cifar10.png",
    "loc-c10/mad_per_layer.png": "mad_per_layer_cifar10.png",
    "loc-c100/behaviour_space.png": "behaviour_space_cifar100.png",
    "loc-syn/behaviour_space.png": "behaviour_space_synthetic.png",
    "registers-c10/figures/norms_dinov2s.png": "registers_norms_cifar10.png",
    "registers-c10/figures/artifacts_dinov2s.png": "registers_artifacts_cifar10.png",
    "norms-syn/norm_histograms.png": "norm_histograms_synthetic.png",
    "pca-c10/pca_maps.png": "pca_maps_cifar10.png",
    "tokens-c10/position_top1_by_layer.png": "tokens_position_cifar10.png",
    "tokens-c10/class_top1_by_layer.png": "tokens_class_cifar10.png",
}


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def timings(runs: Path) -> dict[str, Any]:
    """Wall time and load average of each step, from the ``timings.log`` the run scripts append to: a start line
    ``== NAME:  <uptime>`` and an end line ``== NAME rc=0 301 s;  <uptime>`` or ``== NAME finished ...;  <uptime>``
    (``uptime`` gives the clock time and the 1, 5 and 15 minute load averages)."""
    log = runs / "timings.log"
    clock = r"(\d\d):(\d\d):(\d\d) up .*load average: ([\d.]+), ([\d.]+), ([\d.]+)"
    started: dict[str, int] = {}
    found: dict[str, Any] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        match = re.match(r"== (\S+?)(:| rc=\d+ \d+ s;| finished .*;)\s+" + clock, line)
        if not match:
            continue
        name, kind = match[1], match[2]
        seconds = int(match[3]) * 3600 + int(match[4]) * 60 + int(match[5])
        load = [float(match[k]) for k in (6, 7, 8)]
        if kind == ":":
            started[name] = seconds
            found[name] = {"load_average_at_start_1_5_15_min": load}
        elif name in started:
            found[name] |= {"seconds": (seconds - started[name]) % 86400, "load_average_at_end_1_5_15_min": load}
    return found


def locality(runs: Path) -> dict[str, Any]:
    out = {}
    for key, name in DATASETS.items():
        data = _load(runs / f"loc-{key}" / "locality.json")
        if data is None:
            continue
        layers = data["summary"]["layers"]
        heads = data["heads"]
        out[name] = {
            "images": data["summary"]["num_images"], "min_early_mad": data["summary"]["min_early_mad"],
            "unit": data["metric_options"]["unit"], "renormalize": data["metric_options"]["renormalize"],
            "mad_per_layer": [round(x["mad"], 4) for x in layers],
            "entropy_per_layer": [round(x["entropy"], 4) for x in layers],
            "mad_min_head_per_layer": [round(min(h["mad"] for h in heads if h["layer"] == x["layer"]), 4)
                                       for x in layers],
        }
    return out


def separate_mode(layer: dict[str, Any]) -> bool | None:
    """The registers study's test of one layer (``vitscope.metrics.high_norm.separate_mode``), as ``analyze norms``
    stores it per layer; for a file written before it did: False when the layer's largest norm is under twice its
    median (no split can then reach a mode), else None (unknown: run ``analyze norms`` again)."""
    if "separate_mode" in layer:
        return bool(layer["separate_mode"])
    return False if no_mode_possible(layer["patch_norm_max"], layer["patch_norm_p50"]) else None


def norms(runs: Path) -> dict[str, Any]:
    out = {}
    for key, name in DATASETS.items():
        data = _load(runs / f"norms-{key}" / "norms.json")
        if data is None:
            continue
        threshold = data["threshold"]
        layers = data["layers"]
        out[name] = {
            "threshold": threshold, "images": data["provenance"]["config"].get("num_images"),
            "per_layer": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in x.items() if k != "block"}
                          | {"separate_mode": separate_mode(x)} for x in layers],
            "layers_with_separate_mode": [x["layer"] for x in layers if separate_mode(x)],
        }
    return out


def probe_rows(runs: Path, folder: str) -> dict[str, Any] | None:
    data = _load(runs / folder / "results.json")
    if data is None:
        return None
    rows = []
    for r in data["rows"]:
        row = {k: r[k] for k in ("model", "layer", "group", "metric", "value", "n") if k in r}
        if r["metric"].endswith("top1") and r.get("n"):
            row["wilson95"] = [round(x, 4) for x in wilson_interval(round(r["value"] * r["n"]), r["n"])]
        rows.append(row)
    subsets = data["provenance"].get("subsets") or {}
    return {"rows": rows, "subsets": {k: len(v) if isinstance(v, list) else v for k, v in subsets.items()}}


def main(runs: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"schema_version": 1, "kind": "real-vit-small",
                               "model": "timm:vit_small_patch14_dinov2 + dinov2s_imgfocus_timm.safetensors, 224 px",
                               "locality": locality(runs), "norms": norms(runs), "probes": {}, "timings": timings(runs)}
    larger = [f"{probe}-{data}-1k{pool}{resampling}" for resampling in ("", "-bicubic") for pool in ("", "-cls")
              for data in ("c10", "c100") for probe in ("knn", "linear")]
    for folder in ("knn-c10", "linear-c10", "knn-c100", "linear-c100", "tokens-c10", *larger):
        found = probe_rows(runs, folder)
        if found is not None:
            payload["probes"][folder] = found
    pca = _load(runs / "pca-c10" / "pca.json")
    if pca is not None:
        payload["pca"] = {"settings": pca["settings"], "explained_variance": pca["explained_variance"]}
    registers = _load(runs / "registers-c10" / "results.json")
    if registers is not None:  # the study's verdicts, as its report states them
        payload["registers"] = {
            "claims": [j.to_json() for j in RegistersResults.from_json(registers).claims],
            "thresholds": registers["models"][0]["thresholds"],
            "artifact_layers": {m["label"]: artifact_layers(registers["rows"], m["label"])
                                for m in registers["models"]},
            "images": registers["models"][0]["num_images"], "parameters": registers["models"][0]["parameters"]}
    (out / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
    for source, name in FIGURES.items():
        if (runs / source).is_file():
            shutil.copyfile(runs / source, out / name)
    return out / "results.json"


if __name__ == "__main__":
    args = sys.argv[1:]
    print(main(Path(args[0] if args else "runs/real"), Path(args[1] if len(args) > 1 else
                                                               "docs/results/real-vit-small")))
