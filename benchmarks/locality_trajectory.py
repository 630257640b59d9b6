"""Minimum early-layer MAD of every run of a locality study at each kept snapshot (``snapshots/epoch-*.safetensors``).

The study measures each run once, at its end; this script measures the snapshots the trainer keeps, on the same
evaluation sample, so that a trend over epochs can be read (docs/results/locality-cpu.md). Definitions are those
of docs/definitions.md (MAD normalised to [0, 1], rows renormalised; minimum over the heads of the first quarter of
the layers). At every epoch that all runs reached, the CutMix claims (minimum early MAD, top-1) are judged by the
study's own rule (``vitscope.studies.locality.verdicts.judge``: ``vitscope.stats`` with the locality precondition),
with CutMix conditions against the others. Writes ``trajectory.csv``, ``verdicts.csv`` and
``figures/min_early_mad_by_epoch.png`` into the study folder.

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
from vitscope.data import load_dataset  # noqa: E402
from vitscope.models import load  # noqa: E402
from vitscope.studies.locality.verdicts import LOCAL_MARGIN, judge, locality_precondition  # noqa: E402

UNIFORM_8X8 = 0.4178  # normalised MAD of uniform attention on an 8 x 8 grid (docs/definitions.md)
PAPER_WITH, PAPER_WITHOUT = 0.024, 0.210  # the paper's bounds: CutMix conditions <=, the others >=


def trajectory(study: Path, batch_size: int = 250) -> list[dict]:
    """One row per (condition, seed, epoch): the snapshot's minimum early MAD and mean MAD per layer."""
    rows = []
    eval_sets: dict[tuple, object] = {}
    for config_path in sorted(study.glob("runs/*/seed-*/config.json")):  # finished or not: what is kept so far
        cfg = json.loads(config_path.read_text())["config"]
        key = (cfg["dataset"], cfg["data_dir"], cfg["eval_images"])
        if key not in eval_sets:
            full = load_dataset(cfg["dataset"], cfg["data_dir"], "eval", **cfg["dataset_options"])
            eval_sets[key] = full.subset(cfg["eval_images"])
        for snapshot in sorted((config_path.parent / "snapshots").glob("epoch-*.safetensors")):
            epoch = int(snapshot.stem.split("-")[1])
            with torch.no_grad():
                result = measure_locality(load(str(snapshot)), eval_sets[key], batch_size=batch_size, progress=False)
            mad = result.stats.mad
            rows.append({"condition": cfg["protocol"], "seed": cfg["seed"], "epoch": epoch,
                         "accuracy": result.accuracy, "min_early_mad": result.stats.min_early_mad(),
                         **{f"mad_layer{i + 1}": float(mad[i].nanmean()) for i in range(mad.shape[0])}})
            print(f"{cfg['protocol']:>24} seed {cfg['seed']} epoch {epoch:>3}: "
                  f"min early MAD {rows[-1]['min_early_mad']:.4f}, top-1 {result.accuracy:.3f}", flush=True)
    return rows


def snapshot_verdicts(rows: list[dict]) -> list[dict]:
    """One row per (epoch every run reached, measure): CutMix conditions against the others, judged as the study
    judges its final runs (one value per run; the precondition from each condition's mean minimum early MAD)."""
    runs = {(r["condition"], r["seed"]) for r in rows}
    out = []
    for epoch in sorted({r["epoch"] for r in rows}):
        at = [r for r in rows if r["epoch"] == epoch]
        if {(r["condition"], r["seed"]) for r in at} != runs:
            continue  # some run has not reached this epoch: no comparison of unequal training
        with_, without = ([r for r in at if ("cutmix" in r["condition"]) == side] for side in (True, False))
        if not with_ or not without:
            continue
        minima = {c: float(np.mean([r["min_early_mad"] for r in at if r["condition"] == c]))
                  for c in dict.fromkeys(r["condition"] for r in at)}
        precondition = locality_precondition(minima, UNIFORM_8X8)
        for measure in ("min_early_mad", "accuracy"):
            claim = {"claim": f"cutmix {measure}", "measure": measure,
                     "values_with": [r[measure] for r in with_], "values_without": [r[measure] for r in without]}
            if measure == "min_early_mad":
                claim["precondition"] = {"met": precondition.met, "reason": precondition.reason}
            judged = judge(claim)
            out.append({"epoch": epoch, "measure": measure, "runs_with": judged["runs_with"],
                        "runs_without": judged["runs_without"],
                        "mean_with": float(np.mean(claim["values_with"])),
                        "mean_without": float(np.mean(claim["values_without"])),
                        "difference": judged["difference"], "ci95_low": judged["ci95_low"],
                        "ci95_high": judged["ci95_high"], "paper_effect": judged["expected"],
                        "verdict": judged["verdict"], "reason": judged["reason"]})
            print(f"epoch {epoch:>3} {measure:>13}: with - without {judged['difference']:+.4f} "
                  f"[{judged['ci95_low']:+.4f}, {judged['ci95_high']:+.4f}] -> {judged['verdict']}", flush=True)
    return out


def plot(rows: list[dict], path: Path) -> None:
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colours = plt.get_cmap("tab10")
    for i, condition in enumerate(conditions):
        mine = [r for r in rows if r["condition"] == condition]
        epochs = sorted({r["epoch"] for r in mine})
        values = np.array([[r["min_early_mad"] for r in mine if r["epoch"] == e] for e in epochs])
        style = "-" if "cutmix" in condition or condition in ("modern", "modern-autoaugment",
                                                              "modern-labelsmoothing") else "--"
        ax.plot(epochs, values.mean(axis=1), style, color=colours(i), label=condition, marker="o", ms=3)
        if values.shape[1] > 1:
            ax.fill_between(epochs, values.min(axis=1), values.max(axis=1), color=colours(i), alpha=0.12)
    ax.axhline(UNIFORM_8X8, color="grey", lw=1, ls=":", label="uniform attention (0.4178)")
    ax.axhline(UNIFORM_8X8 - LOCAL_MARGIN, color="grey", lw=1, ls="--",
               label=f"testable below: uniform - {LOCAL_MARGIN:g} ({UNIFORM_8X8 - LOCAL_MARGIN:.4f})")
    ax.axhline(PAPER_WITHOUT, color="black", lw=0.8, ls="-.", label="paper: without CutMix >= 0.210")
    ax.axhline(PAPER_WITH, color="black", lw=0.8, ls="--", label="paper: with CutMix <= 0.024")
    ax.set(xlabel="epoch", ylabel="minimum early-layer MAD (normalised)", ylim=(0, 0.45),
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
    rows = trajectory(args.study)
    write_csv(args.study / "trajectory.csv", rows)
    write_csv(args.study / "verdicts.csv", snapshot_verdicts(rows))
    plot(rows, args.study / "figures" / "min_early_mad_by_epoch.png")
    print(f"wrote {args.study / 'trajectory.csv'}, verdicts.csv and figures/min_early_mad_by_epoch.png")


if __name__ == "__main__":
    main()
