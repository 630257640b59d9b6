"""Writes docs/results/real-claims.md, its figures, results.json and claims.json from the stages of
``benchmarks/real_claims.py``: every number on the page comes from the stored stages, none is typed by hand."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import real_claims_text as text  # noqa: E402

MODEL = "dinov2s-imgfocus"
TWIN = MODEL + " (random init)"
CHANCE = "chance"


def value(rows: list[dict[str, Any]], **match: Any) -> float:
    """The value of the one row matching ``match`` (NaN when none); rows without ``group`` unless one is named."""
    match.setdefault("group", None)
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[0]["value"] if found else math.nan


def num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def signed(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.{digits}f}"


def interval(found: dict[str, Any], digits: int = 1, sign: bool = True) -> str:
    """'+1.2 (-0.3 to +2.7)' from an interval dict (difference, low, high)."""
    f = signed if sign else num
    low, high = found.get("low", found.get("ci95_low")), found.get("high", found.get("ci95_high"))
    return f"{f(found['difference'], digits)} ({f(low, digits)} to {f(high, digits)})"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows),
            ""]


def figure_dense(stage: dict[str, Any], path: Path, metric: str, title: str) -> None:
    """Score by layer, with and without CLS, for the model, its random twin and chance."""
    rows = stage["rows"]
    layers = sorted({r["layer"] for r in rows if r["model"] == MODEL})
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name, style in ((MODEL, "-"), (TWIN, ":")):
        for cls, colour in ((False, "tab:blue"), (True, "tab:orange")):
            ys = [value(rows, model=name, layer=layer, metric=metric, with_cls=cls) for layer in layers]
            label = f"{'random init' if name == TWIN else 'model'}, {'with' if cls else 'without'} CLS"
            ax.plot(layers, ys, style, marker="o", color=colour, label=label)
    chance = value(rows, model=CHANCE, layer=layers[-1], metric=metric)
    ax.axhline(chance, color="grey", lw=1, ls="--")
    ax.annotate(f"chance {chance:.1f}", (layers[0], chance), textcoords="offset points", xytext=(2, 3), fontsize=8,
                color="grey")
    ax.set_xticks(layers)
    ax.set_xlabel("token layer (0 = embedding)")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best", frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure_locality(stage: dict[str, Any], path: Path) -> None:
    """Every head's MAD against its entropy at 224 and 518 px, coloured by layer, with the uniform reference."""
    runs = [name for name in ("224", "518", "224 random init") if name in stage]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), sharey=True)
    axes = [axes] if len(runs) == 1 else axes
    scatter = None
    for ax, name in zip(axes, runs, strict=True):
        mad, entropy = stage[name]["mad"], stage[name]["entropy"]
        xs = [m for row in mad for m in row]
        ys = [e for row in entropy for e in row]
        colours = [layer + 1 for layer, row in enumerate(mad) for _ in row]
        scatter = ax.scatter(xs, ys, c=colours, cmap="viridis", s=18, vmin=1, vmax=len(mad))
        side = stage[name]["side"]
        grid = side // 14
        ax.axvline(text.uniform_mad(grid), color="grey", lw=1, ls="--")
        ax.annotate("uniform", (text.uniform_mad(grid), 0.02), fontsize=7, color="grey", rotation=90,
                    xytext=(-9, 0), textcoords="offset points")
        ax.set_title(f"{name} px ({grid} x {grid} patches, {stage[name]['images']} frames)", fontsize=9)
        ax.set_xlabel("MAD (normalised)")
        ax.set_xlim(0, 0.55)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("attention entropy (normalised)")
    fig.colorbar(scatter, ax=axes, label="attention layer", shrink=0.85)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def figure_s2(stages: dict[str, Any], path: Path) -> None:
    """The S2 profiles by layer: position top-1 (CamVid), PiB class score (synthetic), class from one patch token
    (CIFAR-10), each beside its random twin and chance."""
    panels = [("position", "position_top1", "patch", "position top-1, CamVid"),
              ("pib", "pib", "class", "Point-in-Box (%), class score, synthetic"),
              ("cifar", "class_top1", "patch", "class from one patch token, CIFAR-10")]
    panels = [p for p in panels if p[0] in stages]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.4))
    axes = [axes] if len(panels) == 1 else axes
    for ax, (stage, metric, group, title) in zip(axes, panels, strict=True):
        rows = stages[stage]["rows"]
        for name, style in ((MODEL, "-o"), (TWIN, ":o"), (CHANCE, "--")):
            points = sorted((r["layer"], r["value"]) for r in rows if r["model"] == name and r["metric"] == metric
                            and r.get("group") == group)
            if points:
                ax.plot(*zip(*points, strict=True), style, label="random init" if name == TWIN else name,
                        color={"chance": "grey"}.get(name))
        layers = sorted({r["layer"] for r in rows if r["metric"] == metric})
        ax.set_xticks(layers)
        ax.set_xlabel("layer")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(stages: dict[str, Any], run: dict[str, Any], out: Path, page: Path) -> Path:
    """The page, its figures, results.json (every stage) and claims.json (every Judgement, each with its scope)."""
    out.mkdir(parents=True, exist_ok=True)
    claims = [c for name in ("camvid", "depth", "position", "pib", "cifar") for c in stages.get(name, {})
              .get("claims", [])]
    (out / "claims.json").write_text(json.dumps(claims, indent=1) + "\n")
    (out / "results.json").write_text(json.dumps({"schema_version": 1, "kind": "real-claims", "run": run,
                                                  "machine": platform.platform(), "stages": stages}, indent=1) + "\n")
    figures = {}
    if "camvid" in stages:
        figures["camvid"] = "miou_by_layer_camvid.png"
        figure_dense(stages["camvid"], out / figures["camvid"], "miou", "CamVid mIoU by layer (mean of head seeds)")
    if "depth" in stages:
        figures["depth"] = "rmse_by_layer_synthetic.png"
        figure_dense(stages["depth"], out / figures["depth"], "rmse", "synthetic depth RMSE by layer (lower is better)")
    if "locality" in stages:
        figures["locality"] = "locality_heads_camvid.png"
        figure_locality(stages["locality"], out / figures["locality"])
    if any(name in stages for name in ("position", "pib", "cifar")):
        figures["s2"] = "s2_by_layer.png"
        figure_s2(stages, out / figures["s2"])
    page.write_text(text.render(stages, run, claims, figures, out.name) + "\n")
    return page
