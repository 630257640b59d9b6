"""Minimum early-layer MAD of every run of a locality study at each kept snapshot (``snapshots/epoch-*.safetensors``).

The study measures each run once, at its end; this script measures the snapshots the trainer keeps, on the same
evaluation sample, so that a trend over epochs can be read (docs/results/locality-cpu.md). Definitions are those
of docs/definitions.md and the study's (``vitscope.studies.locality.readings``: MAD normalised to [0, 1], CLS
excluded and rows renormalised, and beside it with CLS counted at distance 0; minimum over the heads of the first
quarter of the layers). At every epoch that all runs reached, the study's own verdicts are computed
(``vitscope.studies.locality.verdicts.judge_runs``: every claim of the registry that the conditions allow, each by
its kind of test, with the locality precondition against uniform attention on the runs' own grid). Writes
``trajectory.csv``, ``verdicts.csv`` and ``figures/min_early_mad_by_epoch.png`` into the study folder.

    python benchmarks/locality_trajectory.py STUDY_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from vitscope.analyze import measure_locality  # noqa: E402
from vitscope.atomic_io import write_csv  # noqa: E402
from vitscope.claims import claim  # noqa: E402
from vitscope.data import load_dataset  # noqa: E402
from vitscope.models import load  # noqa: E402
from vitscope.studies.locality import readings as rd  # noqa: E402
from vitscope.studies.locality.records import LocalityRun  # noqa: E402
from vitscope.studies.locality.results import LocalityResults  # noqa: E402
from vitscope.studies.locality.verdicts import LOCAL_MARGIN, grid_uniform, has_cutmix, judge_runs  # noqa: E402


def snapshots(study: Path, batch_size: int = 250) -> dict[int, list[LocalityRun]]:
    """Every kept snapshot measured as the study measures a finished run: epoch -> the runs that reached it."""
    found: dict[int, list[LocalityRun]] = {}
    eval_sets: dict[tuple, object] = {}
    for config_path in sorted(study.glob("runs/*/seed-*/config.json")):  # finished or not: what is kept so far
        cfg = json.loads(config_path.read_text())["config"]
        key = (cfg["dataset"], cfg["data_dir"], cfg["eval_images"])
        if key not in eval_sets:
            full = load_dataset(cfg["dataset"], cfg["data_dir"], "eval", **cfg["dataset_options"])
            eval_sets[key] = full.subset(cfg["eval_images"])
        for snapshot in sorted((config_path.parent / "snapshots").glob("epoch-*.safetensors")):
            epoch = int(snapshot.stem.split("-")[1])
            model = load(str(snapshot))
            with torch.no_grad():
                result = measure_locality(model, eval_sets[key], batch_size=batch_size, progress=False)
            stats = result.stats
            run = LocalityRun(cfg["protocol"], cfg["seed"], accuracy=result.accuracy, layers=stats.layers,
                              mad=stats.mad.tolist(), entropy=stats.entropy.tolist(),
                              mad_cls_at_zero=stats.mad_raw.tolist(), num_images=result.num_images,
                              grid_size=list(model.grid_size), num_prefix_tokens=model.num_prefix_tokens,
                              patch_size=model.patch_size, train_config=cfg)
            found.setdefault(epoch, []).append(run)
            print(f"{run.condition:>24} seed {run.seed} epoch {epoch:>3}: min early MAD "
                  f"{rd.min_early_mad(run, rd.stated(run.num_layers)):.4f}, top-1 {result.accuracy:.3f}", flush=True)
    return found


def trajectory_rows(found: dict[int, list[LocalityRun]], early_layers: list[int] | None) -> list[dict]:
    """One row per (condition, seed, epoch): top-1, the minimum early MAD under both MAD readings, MAD per layer."""
    rows = []
    for epoch, runs in sorted(found.items()):
        for run in runs:
            main = rd.stated(run.num_layers, early_layers)
            cls0 = rd.Reading("mad_cls_at_zero", main.early, main.early_words)
            mad = np.asarray(run.mad, dtype=float)
            rows.append({"condition": run.condition, "seed": run.seed, "epoch": epoch, "accuracy": run.accuracy,
                         "min_early_mad": rd.min_early_mad(run, main),
                         "min_early_mad_cls_at_zero": rd.min_early_mad(run, cls0),
                         **{f"mad_layer{i + 1}": float(np.nanmean(mad[i])) for i in range(mad.shape[0])}})
    return rows


def snapshot_verdicts(found: dict[int, list[LocalityRun]], dataset: str,
                      early_layers: list[int] | None) -> list[dict]:
    """At every epoch all runs reached, the study's verdicts (``judge_runs``) on the claims these conditions
    measure: one row per (epoch, claim)."""
    everyone = {(r.condition, r.seed) for runs in found.values() for r in runs}
    out = []
    for epoch, runs in sorted(found.items()):
        if {(r.condition, r.seed) for r in runs} != everyone:
            continue  # some run has not reached this epoch: no comparison of unequal training
        for j in judge_runs(runs, dataset=dataset, early_layers=early_layers):
            if j.difference is None:
                continue  # a claim these conditions do not measure
            out.append({"epoch": epoch, "claim": j.claim_id, "kind": j.kind, "a": j.a, "b": j.b,
                        "difference": j.difference, "ci95_low": j.ci95_low, "ci95_high": j.ci95_high,
                        "verdict": j.verdict, "reason": j.reason, "readings": "; ".join(
                            f"{r.name}: {r.verdict} ({r.difference:+.4f})" for r in j.readings)})
            print(f"epoch {epoch:>3} {j.claim_id:>16}: {j.interval_text()} -> {j.verdict}", flush=True)
    return out


def plot(rows: list[dict], uniform: float, path: Path) -> None:
    bounds = claim("L4").test  # the paper's separation: with CutMix <= upper, without >= lower
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colours = plt.get_cmap("tab10")
    for i, condition in enumerate(conditions):
        mine = [r for r in rows if r["condition"] == condition]
        epochs = sorted({r["epoch"] for r in mine})
        values = np.array([[r["min_early_mad"] for r in mine if r["epoch"] == e] for e in epochs])
        style = "-" if has_cutmix(condition) else "--"
        ax.plot(epochs, values.mean(axis=1), style, color=colours(i), label=condition, marker="o", ms=3)
        if values.shape[1] > 1:
            ax.fill_between(epochs, values.min(axis=1), values.max(axis=1), color=colours(i), alpha=0.12)
    ax.axhline(uniform, color="grey", lw=1, ls=":", label=f"uniform attention ({uniform:.4f})")
    ax.axhline(uniform - LOCAL_MARGIN, color="grey", lw=1, ls="--",
               label=f"testable below: uniform - {LOCAL_MARGIN:g} ({uniform - LOCAL_MARGIN:.4f})")
    ax.axhline(bounds.lower, color="black", lw=0.8, ls="-.",
               label=f"paper (CIFAR-100): without CutMix >= {bounds.lower:g}")
    ax.axhline(bounds.upper, color="black", lw=0.8, ls="--",
               label=f"paper (CIFAR-100): with CutMix <= {bounds.upper:g}")
    ax.set(xlabel="epoch", ylabel="minimum early-layer MAD (normalised)", ylim=(0, max(0.45, uniform * 1.08)),
           title="Minimum early-layer MAD by epoch (solid: with CutMix; band: seed range)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    args = parser.parse_args()
    found = snapshots(args.study)
    if not found:
        raise SystemExit(f"no snapshots under {args.study}/runs/*/seed-*/snapshots; train with snapshots kept")
    any_run = next(iter(found.values()))[0]
    early = None
    if (args.study / "results.json").is_file():
        early = LocalityResults.read(args.study).early_layers
    rows = trajectory_rows(found, early)
    write_csv(args.study / "trajectory.csv", rows)
    write_csv(args.study / "verdicts.csv", snapshot_verdicts(found, any_run.train_config["dataset"], early))
    uniform = grid_uniform([r for runs in found.values() for r in runs])
    if uniform is None:
        raise SystemExit("the snapshots were measured on different grids; plot them one grid at a time")
    plot(rows, uniform, args.study / "figures" / "min_early_mad_by_epoch.png")
    print(f"wrote {args.study / 'trajectory.csv'}, verdicts.csv and figures/min_early_mad_by_epoch.png")


if __name__ == "__main__":
    main()
