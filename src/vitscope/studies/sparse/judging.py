"""The sparse study's verdicts: every claim of seed 001 in the registry (``vitscope.claims.sparse``), each judged once
by its kind of test (``vitscope.claims.judge``) on one value per seed, every seed used; what these runs cannot judge
is 'not testable' with the reason, the qualitative claims 'not judged' with what the study shows for them.

- S4 (and S4-reg4, S4-specialization): linear top-1 under the study's protocol (DINO's for ViT-S by default), the
  other protocol as a second reading;
- S3: the softmax runs' mIoU with the CLS token concatenated minus without, paired by seed, on the first
  segmentation set at the last layer;
- S5-S7: each on the paper's own set (VOC, ADE20K, Cityscapes) when the run measures it: the paper's numbers are
  per set; S8-*: on every segmentation set measured, reproduced only when every set is;
- S9: depth RMSE with CLS concatenated (the seed's protocol) on NYUv2 (vitscope reads no SUN RGB-D or KITTI);
- S11: run by run, every entmax-1.5 run gives exact zeros (softmax cannot: 0 by construction), a census.

Every verdict carries the scope (this run's model, data and sample beside the paper's), the size beside the
paper's, and a sentence on what the seeds can detect (``details["power_sentence"]``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from vitscope.claims import Claim, Judgement, claim, claims_of
from vitscope.claims.judge import judge, judge_census, missing, not_judged
from vitscope.stats import compare
from vitscope.studies.sparse import values as V
from vitscope.studies.sparse.conditions import BASELINE

Groups = dict[str, list[V.Record]]
PAPER_SEG_SETS = {"S5": "seg:voc", "S6": "seg:ade20k", "S7": "seg:cityscapes"}
PAPER_DEPTH_SETS = ("depth:nyu",)  # NYUv2; vitscope has no SUN RGB-D or KITTI layout
PAPER_NAMES = {"seg:voc": "VOC", "seg:ade20k": "ADE20K", "seg:cityscapes": "Cityscapes", "depth:nyu": "NYUv2"}
PROTOCOLS = {"dino-last4": "DINO's linear protocol (the last four blocks' CLS tokens concatenated)",
             "last-cls": "the last layer's CLS token alone"}
OFFERED = {
    "S1": "vitscope's own two measures of diffusion (class top-1 from one background token, background-patch/CLS "
          "cosine) are compared in the table of measured differences, without a verdict: the seed defines no "
          "measure of semantic diffusion",
    "S10": "PCA maps of the last layer's patch tokens (first three components as RGB), side by side in the report",
    "S12": "each verdict states the model, data and sample it holds for beside the paper's",
}
S2_WHY = ("judged on a real DINO model by the token and Point-in-Box probes (docs/claims.md); this study draws "
          "layer-wise mIoU and Point-in-Box as curves only, and the seed names no layers to compare")


def run_scope(records: list[V.Record], settings: dict[str, Any]) -> str:
    """This run's model, data and sample beside the paper's, in one sentence; it says when they differ."""
    paper = claim("S4").paper
    trained = [r["source"]["trained"] for r in records if "trained" in (r.get("source") or {})]
    given = sorted({r["condition"] for r in records if "given" in (r.get("source") or {})})
    seeds = min((len({r["seed"] for r in runs}) for runs in V.by_condition(records).values()), default=0)
    parts = []
    if trained:
        t = trained[0]
        images = (t.get("dataset_options") or {}).get("num_images") or t.get("train_images")
        parts.append(f"{t['model']} pretrained with DINO for {t['epochs']} epoch{'s' if t['epochs'] != 1 else ''} "
                     f"on {t['dataset']}" + (f" ({images} images)" if images else ""))
    if given:
        parts.append(f"the given models {', '.join(given)}")
    if records:
        parts.append(f"{seeds} seed{'s' if seeds != 1 else ''} per condition; probes fitted on "
                     f"{records[0]['probe_train_images']} and measured on {records[0]['eval_images']} images")
    same = settings.get("preset") == "paper" and bool(trained) and all(t["epochs"] >= 200 for t in trained)
    lead = "the paper's recipe" if same else "not the paper's setting"
    return f"{lead}: this run {'; '.join(parts)}; the paper's {paper.model}, {paper.scale}"


def _with_power(judgement: Judgement, a: list[float], b: list[float] | float, paired: bool = False) -> Judgement:
    """The judgement with ``details["power_sentence"]``: what these seeds can detect with the test used."""
    result = compare(a, b, sign=1, threshold=None, paired=paired)
    judgement.details["power_sentence"] = result.power_sentence()
    return judgement


def _side(groups: Groups, condition: str, reader: Callable[[V.Record], float]) -> list[float] | None:
    runs = groups.get(condition)
    return None if runs is None else [reader(r) for r in runs]


def _absent(c: Claim, groups: Groups, a: list[float] | None, b: list[float] | None, what: str) -> Judgement | None:
    """'not testable' when a condition was not run or a side has no measured value of ``what``."""
    for name, side in ((c.a, a), (c.b, b)):
        if side is None:
            present = ", ".join(groups) or "none"
            return missing(c, f"no {name} runs in this study (conditions: {present}); add it with --conditions")
        if not any(math.isfinite(v) for v in side):
            return missing(c, f"{what} was not measured in the {name} runs")
    return None


def _pair(c: Claim, groups: Groups, reader: Callable[[V.Record], float], what: str, scope: str,
          readings: dict[str, Callable[[V.Record], float]] | None = None) -> Judgement:
    a, b = _side(groups, c.a, reader), _side(groups, c.b, reader)
    absent = _absent(c, groups, a, b, what)
    if absent is not None:
        return absent
    other = {name: (_side(groups, c.a, r), _side(groups, c.b, r)) for name, r in (readings or {}).items()}
    other = {name: pair for name, pair in other.items()
             if all(any(math.isfinite(v) for v in side) for side in pair)}
    return _with_power(judge(c, a, b, scope=scope, readings=other or None), a, b)


def _linear(c: Claim, groups: Groups, scope: str, protocol: str) -> Judgement:
    alternative = next(p for p in PROTOCOLS if p != protocol)
    return _pair(c, groups, lambda r: V.linear_top1(r, protocol), "linear top-1",
                 f"{scope}; linear probe: {PROTOCOLS[protocol]}",
                 readings={PROTOCOLS[alternative]: lambda r: V.linear_top1(r, alternative)})


def _on_set(c: Claim, groups: Groups, group: str, scope: str, with_cls: bool = False) -> Judgement:
    what = f"{group[group.index(':') + 1:]} {'RMSE' if group.startswith('depth:') else 'mIoU'}"
    probe = "CLS concatenated to the patch tokens" if with_cls else "patch tokens only"
    return _pair(c, groups, lambda r: V.dense_value(r, group, with_cls=with_cls), what,
                 f"{scope}; {group[group.index(':') + 1:]} at the last layer, {probe}")


def _paper_set(c: Claim, groups: Groups, records: list[V.Record], group: str, scope: str,
               with_cls: bool = False) -> Judgement:
    kind = group.split(":")[0]
    measured = V.dense_groups(records, kind)
    if group not in measured:
        name = PAPER_NAMES[group]
        kind_words = "segmentation" if kind == "seg" else "depth"
        return missing(c, f"this run measures no {name} set (its {kind_words} sets: "
                          f"{', '.join(g.split(':')[1] for g in measured) or 'none'}); the paper's numbers are per "
                          f"set, so {c.id} is judged on {name} alone (--{kind} {group.split(':')[1]}=PATH)")
    return _on_set(c, groups, group, scope, with_cls)


def _every_set(c: Claim, groups: Groups, records: list[V.Record], scope: str) -> Judgement:
    """A claim on all segmentation sets: judged on each measured set; reproduced when every set is, not reproduced
    when any is, else inconclusive; the numbers shown are the weakest set's."""
    sets = V.dense_groups(records, "seg")
    if not sets:
        return missing(c, "this run measures no segmentation set (--seg NAME=PATH)")
    each = {g: _on_set(c, groups, g, scope) for g in sets}
    if len(each) == 1:
        return next(iter(each.values()))
    verdicts = {j.verdict for j in each.values()}
    found = {g: {"difference": j.difference, "ci95_low": j.ci95_low, "ci95_high": j.ci95_high,
                 "verdict": j.verdict} for g, j in each.items()}
    judged = [j for j in each.values() if j.difference is not None and math.isfinite(j.difference)]
    weakest = min(judged, key=lambda j: c.test.direction * j.difference) if judged else next(iter(each.values()))
    if verdicts == {"reproduced"}:
        decided = ("reproduced", f"reproduced on each of the {len(each)} sets")
    elif "not reproduced" in verdicts:
        decided = ("not reproduced", "not reproduced on " + ", ".join(g for g, j in each.items()
                                                                     if j.verdict == "not reproduced"))
    elif verdicts == {"not testable"}:
        decided = ("not testable", weakest.reason)
    else:
        decided = ("inconclusive", "not every set reproduces it: " + "; ".join(f"{g} {j.verdict}"
                                                                           for g, j in each.items()))
    details = {**weakest.details, "sets": found}
    return dataclasses.replace(weakest, verdict=decided[0], reason=decided[1], details=details,
                               scope=f"{scope}; on {', '.join(s.split(':')[1] for s in sets)} (the numbers: the "
                                     f"weakest set, {weakest.scope.rsplit('; ', 1)[-1]})")


def _cls_helps(c: Claim, groups: Groups, records: list[V.Record], scope: str) -> Judgement:
    sets = V.dense_groups(records, "seg")
    if not sets:
        return missing(c, "this run measures no segmentation set (--seg NAME=PATH)")
    runs = groups.get(BASELINE)
    if not runs:
        return missing(c, f"no {BASELINE} runs in this study: the claim is about the baseline model")
    group = sets[0]
    with_cls = [V.dense_value(r, group, with_cls=True) for r in runs]
    without = [V.dense_value(r, group) for r in runs]
    if not all(any(math.isfinite(v) for v in side) for side in (with_cls, without)):
        return missing(c, f"{group} was not measured both with and without CLS")
    where = f"{scope}; the {BASELINE} runs, {group.split(':')[1]} at the last layer, paired by seed"
    return _with_power(judge(c, with_cls, without, paired=True, scope=where), with_cls, without, paired=True)


def _zeros(c: Claim, groups: Groups, scope: str) -> Judgement:
    """S11 run by run: does every entmax-1.5 run give exact zeros (softmax cannot, by construction)? The fractions,
    and their one-sample interval against softmax's known 0, are kept beside in ``details``."""
    runs = groups.get("entmax15") or []
    if not runs:
        return missing(c, "no entmax15 runs in this study")
    fractions = {f"entmax15 seed {r.get('seed', i)}": V.zeros(r) for i, r in enumerate(runs)}
    where = f"{scope}; softmax's fraction is 0 by construction (a known value, not a sample)"
    against_zero = compare(list(fractions.values()), 0.0, sign=1, threshold=None)
    return judge_census(c, {name: value > 0 for name, value in fractions.items()}, scope=where, details={
        "fractions": fractions, "against_softmax": {"difference": against_zero.difference,
                                                    "ci95_low": against_zero.low, "ci95_high": against_zero.high,
                                                    "method": against_zero.method}})


def judge_claims(records: list[V.Record], settings: dict[str, Any]) -> list[Judgement]:
    """Every sparse claim of the registry, in its order, judged on ``records`` (each once)."""
    groups = V.by_condition(records)
    scope = run_scope(records, settings)
    protocol = next((r["image"].get("linear_protocol", V.OLD_PROTOCOL) for r in records), "dino-last4")
    out = []
    for c in claims_of("sparse"):
        if c.test.kind == "qualitative":
            out.append(not_judged(c, OFFERED.get(c.id, "")))
        elif c.id.startswith("S2"):
            out.append(missing(c, S2_WHY))
        elif c.id == "S3":
            out.append(_cls_helps(c, groups, records, scope))
        elif c.id.startswith("S4"):
            out.append(_linear(c, groups, scope, protocol))
        elif c.id in PAPER_SEG_SETS:
            out.append(_paper_set(c, groups, records, PAPER_SEG_SETS[c.id], scope))
        elif c.id.startswith("S8"):
            out.append(_every_set(c, groups, records, scope))
        elif c.id == "S9":
            out.append(_paper_set(c, groups, records, PAPER_DEPTH_SETS[0], scope, with_cls=True))
        elif c.id == "S11":
            out.append(_zeros(c, groups, scope))
        else:
            out.append(missing(c, "the sparse study has no test for this claim"))
    return out
