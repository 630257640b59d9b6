"""Claims judged on token-level probe rows, with intervals clustered by image (never by token):

- ``judge_layers``: one measure at two token layers of the same held-out tokens (S2: shallow against deep layers,
  e.g. position top-1, class from one patch token, Point-in-Box hits), paired by image;
- ``judge_groups``: one measure on two token groups of the same images at one layer (R8: the highest-norm tokens
  against the rest), unpaired, each side clustered by image.

- ``judge_with_group``: R9 on ``vitscope.probes.cls_with_tokens`` rows, CLS plus a token group's mean against CLS
  alone on the same held-out images, paired by image.

Rows are ``vitscope.probes.tokens`` (and ``vitscope.probes.pib``) rows whose ``units`` hold per-image sums and
counts; the verdict is ``vitscope.claims.judge``'s (``vitscope.stats``: the cluster-robust interval over images,
or two one-sided tests for an equivalence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vitscope.claims import Claim, Judgement
from vitscope.claims.judge import judge, missing
from vitscope.metrics.units import unit_values
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX


def find_row(rows: Sequence[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The first row whose fields equal ``match``."""
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _context(rows: Sequence[dict[str, Any]], model: str, metric: str, layers: Sequence[int], groups: Sequence[str]
             ) -> list[dict[str, Any]]:
    """The rows a judgement came from: the model's, its random twin's and chance's, without their units."""
    keep = (model, model + RANDOM_SUFFIX, CHANCE)
    return [{k: v for k, v in r.items() if k != "units"} for r in rows
            if r["model"] in keep and r["metric"] == metric and r["layer"] in layers and r.get("group") in groups]


def paired_units(row_a: dict[str, Any], row_b: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-unit values of two rows over the images both hold (per-image means repeated by the smaller count),
    and their image labels: a paired, image-clustered comparison."""
    a = dict(zip(row_a["units"]["images"], zip(row_a["units"]["sums"], row_a["units"]["counts"], strict=True),
                 strict=True))
    b = dict(zip(row_b["units"]["images"], zip(row_b["units"]["sums"], row_b["units"]["counts"], strict=True),
                 strict=True))
    shared = sorted(set(a) & set(b))
    counts = np.array([min(a[i][1], b[i][1]) for i in shared], dtype=int)
    means_a = np.array([a[i][0] / max(a[i][1], 1) for i in shared])
    means_b = np.array([b[i][0] / max(b[i][1], 1) for i in shared])
    return np.repeat(means_a, counts), np.repeat(means_b, counts), np.repeat(np.array(shared), counts)


def judge_layers(claim: Claim, rows: Sequence[dict[str, Any]], *, model: str, metric: str, group: str,
                 a_layer: int, b_layer: int, scope: str, readings: Mapping[str, tuple[int, int]] | None = None
                 ) -> Judgement:
    """``claim`` on ``metric`` of token ``group`` at layer ``a_layer`` minus ``b_layer`` (the claim's a and b:
    e.g. shallow minus deep), paired by image; ``readings`` {name: (a_layer, b_layer)} other layer choices."""
    found = {}
    for name, (la, lb) in {"main": (a_layer, b_layer), **(readings or {})}.items():
        row_a = find_row(rows, model=model, layer=la, group=group, metric=metric)
        row_b = find_row(rows, model=model, layer=lb, group=group, metric=metric)
        if row_a is None or row_b is None or "units" not in row_a or "units" not in row_b:
            if name == "main":
                return missing(claim, f"no {metric} rows with per-image units at layers {la} and {lb}", scope=scope)
            continue
        a, b, images = paired_units(row_a, row_b)
        found[name] = (a, b, images)
    a, b, images = found.pop("main")
    others = {f"layers {readings[n][0]} - {readings[n][1]}": (v[0], v[1]) for n, v in found.items()
              if np.array_equal(v[2], images)}
    layers = sorted({a_layer, b_layer, *(x for pair in (readings or {}).values() for x in pair)})
    return judge(claim, a, b, paired=True, clusters=images, scope=scope, layer=a_layer,
                 a_label=f"layer {a_layer}", b_label=f"layer {b_layer}", rows=_context(rows, model, metric, layers,
                                                                                     [group]),
                 readings=others or None, unit="images")


def judge_groups(claim: Claim, rows: Sequence[dict[str, Any]], *, model: str, metric: str, layer: int,
                 a_group: str, b_group: str, scope: str, a_label: str | None = None, b_label: str | None = None
                 ) -> Judgement:
    """``claim`` on ``metric`` at ``layer``: token group a minus group b of the same images, each side clustered
    by image (an image may hold tokens of both)."""
    row_a = find_row(rows, model=model, layer=layer, group=a_group, metric=metric)
    row_b = find_row(rows, model=model, layer=layer, group=b_group, metric=metric)
    if row_a is None or row_b is None or "units" not in row_a or "units" not in row_b:
        return missing(claim, f"no {metric} rows with per-image units for {a_group} and {b_group} at layer {layer}",
                       scope=scope, layer=layer)
    (a, ia), (b, ib) = unit_values(row_a["units"]), unit_values(row_b["units"])
    return judge(claim, a, b, clusters=(ia, ib), scope=scope, layer=layer, a_label=a_label or a_group,
                 b_label=b_label or b_group, rows=_context(rows, model, metric, [layer], [a_group, b_group]),
                 unit="images")


def judge_with_group(claim: Claim, rows: Sequence[dict[str, Any]], *, model: str, group: str, scope: str,
                     a_label: str | None = None) -> Judgement:
    """``claim`` (R9) on ``vitscope.probes.cls_with_tokens`` rows of ``model``: ``cls+GROUP`` minus ``cls (GROUP
    images)``, image top-1 on the same held-out images, paired by image."""
    both = find_row(rows, model=model, group=f"cls+{group}", metric="image_top1")
    alone = find_row(rows, model=model, group=f"cls ({group} images)", metric="image_top1")
    if both is None or alone is None:
        return missing(claim, f"no cls+{group} and cls ({group} images) rows of {model}", scope=scope)
    with_group, cls_only, images = paired_units(both, alone)
    layer = both["layer"]
    return judge(claim, with_group, cls_only, paired=True, scope=scope, layer=layer,
                 a_label=a_label or f"CLS + mean of {group}", b_label="CLS",
                 rows=_context(rows, model, "image_top1", [layer], [f"cls+{group}", f"cls ({group} images)"]),
                 unit="images")
