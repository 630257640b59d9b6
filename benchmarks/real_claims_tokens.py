"""The token-level stages of ``benchmarks/real_claims.py``: S2 (position on CamVid, Point-in-Box on synthetic
scenes, class from single patch tokens on CIFAR-10), R8 and R9 on CIFAR-10 with this model's highest-norm tokens as
a stand-in group, and the controls of the +CLS investigation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vitscope.analyze.inputs import model_view_options
from vitscope.claims import claim
from vitscope.data import load_dataset
from vitscope.data.synthetic import synthetic_scenes
from vitscope.metrics.high_norm import separate_mode
from vitscope.probes.cls_with_tokens import cls_with_tokens
from vitscope.probes.dense.heads import fit_heads
from vitscope.probes.dense.modules import HeadInputs
from vitscope.probes.features import extract_features
from vitscope.probes.linear import fit_regressor
from vitscope.probes.pib import pib_probe
from vitscope.probes.token_claims import find_row, judge_groups, judge_layers, judge_with_group
from vitscope.probes.tokens import probe_tokens

LAYERS = [0, 3, 6, 9, 12]
TOP_K = 5  # each image's 5 highest-norm patch tokens (2 % of 256): this model's stand-in "high-norm" group
# a smaller sweep for the 256-way position classifier (the default 9 pairs x 100 epochs cost 77 s of CPU a fit)
POSITION_FIT = {"lrs": (1e-2, 1e-1), "weight_decays": (1e-4,), "epochs": 50}
STAND_IN = (f"each image's {TOP_K} highest-norm patch tokens at the last layer (top 2 %; a stand-in: this model "
            "has no separate high-norm mode, so these are the tail of one distribution, not artifacts)")

NO_MODE = ("this model's last-layer patch norms have no separate high-norm mode (the registers study's test): no "
           "high-norm tokens in the claim's sense; the interval is the stand-in group's (details.stand_in: its own "
           "verdict)")


def _registers_scope() -> str:
    import real_claims as main

    return main.REGISTERS_SCOPE


def _names():
    import real_claims as main

    return main.MODEL, main.TWIN, main.MODEL_SCOPE


def cifar10(ctx: Any, count: int, seed: int = 0):
    """A seeded class-stratified sample of CIFAR-10's test split, viewed as the model sees it (bicubic)."""
    import real_claims as main

    view = model_view_options(ctx.model, "cifar10", 224)
    return load_dataset("cifar10", main.CIFAR_TAR, "eval", **view).subset(count, seed=seed)


def stage_position(ctx: Any) -> dict[str, Any]:
    """S2-alignment from a position probe on CamVid's 171 training frames (whole frames at 224 px, as the dense
    probe sees them): patch index top-1 by layer, the model and its random twin."""
    model_name, twin_name, scope = _names()
    train, _ = ctx.camvid
    view = train.model_view(224)
    rows = []
    for name, backbone in ((model_name, ctx.model), (twin_name, ctx.twin)):
        rows += probe_tokens(backbone, view, LAYERS if not ctx.quick else [3, 12], probes=("position",),
                             baseline=False, label=name, batch_size=32, cache=ctx.cache, fit_options=POSITION_FIT,
                             max_tokens=ctx.scale(2048, 256)).rows
    shallow = 3
    judgement = judge_layers(claim("S2-alignment"), rows, model=model_name, metric="position_top1", group="patch",
                             a_layer=shallow, b_layer=12, scope=f"{scope}; CamVid street frames "
                             f"({len(view)} frames, half fitted, half held out)",
                             readings={"0-12": (0, 12), "6-12": (6, 12)} if not ctx.quick else None)
    judgement.measure = "position top-1 (patch index from one patch token)"
    return {"rows": _without_units(rows), "claims": [judgement.to_json()], "images": len(view)}


def stage_pib(ctx: Any) -> dict[str, Any]:
    """S2-alignment from Point-in-Box on synthetic shape scenes with boxes (224 px; no real boxes with an image
    class were at hand): the class-evidence score (vitscope's alignment score) and CLS attention, by layer. Shape
    scenes hold one object and its box (a third of the patches); the texture scenes' box spans all four objects
    (98 % of the patches), which leaves PiB nothing to find."""
    model_name, _, scope = _names()
    data = synthetic_scenes("eval", ctx.scale(160, 16), 224, 8, 0, cue="shape")
    out: dict[str, Any] = {"images": len(data), "claims": [], "rows": []}
    for score, layers in (("class", LAYERS), ("attention", [1, 3, 6, 9, 12])):
        layers = layers if not ctx.quick else [3, 12]
        result = pib_probe(ctx.model, data, layers, score=score, label=model_name, batch_size=32, cache=ctx.cache,
                           seed=0)
        out["rows"] += result.rows
        judgement = judge_layers(claim("S2-alignment"), result.rows, model=model_name, metric="pib", group=score,
                                 a_layer=3, b_layer=12, scope=f"{scope}; synthetic shape scenes with one box "
                                 f"each ({result.settings['scored_images']} scored images, 224 px)",
                                 readings={"1-12" if score == "attention" else "0-12": (layers[0], 12),
                                           "6-12": (6, 12)} if not ctx.quick else None)
        judgement.measure = f"Point-in-Box, {score} score"
        out["claims"].append(judgement.to_json())
    out["rows"] = _without_units(out["rows"])
    return out


def stage_cifar(ctx: Any) -> dict[str, Any]:
    """S2-semantics (class from one patch token by layer), R8 (pixels and class, the stand-in group against the
    rest) and R9 (CLS against CLS + the group's mean) on CIFAR-10, model and twin."""
    model_name, twin_name, scope = _names()
    data = cifar10(ctx, ctx.scale(200, 40))  # the 200-image sample (seed 0) of the locality stage
    layers = LAYERS if not ctx.quick else [3, 12]
    images = f"CIFAR-10 test images ({len(data)}, class-stratified, 32 px shown at 224 px, bicubic)"
    where, registers_where = f"{scope}; {images}", f"{_registers_scope()}; {images}"
    out: dict[str, Any] = {"images": len(data), "claims": [], "rows": [], "norms": {}, "r9": {}}
    for name, backbone in ((model_name, ctx.model), (twin_name, ctx.twin)):
        norms = extract_features(backbone, data, [12], norm=False, batch_size=32, cache=ctx.cache)[12]
        patch_norms = norms.patches.float().norm(dim=-1)  # (N, P), before the final norm
        top = torch.zeros_like(patch_norms, dtype=torch.bool)
        top.scatter_(1, patch_norms.topk(TOP_K, dim=1).indices, True)
        mode = separate_mode(patch_norms)
        out["norms"][name] = {**mode.as_dict(), "max_over_median": float(patch_norms.max() / patch_norms.median()),
                              "stand_in_min_over_median": float(patch_norms[top].min() / patch_norms.median())}
        semantics = probe_tokens(backbone, data, layers, probes=("class",), baseline=False, label=name,
                                 batch_size=32, cache=ctx.cache).rows
        groups = probe_tokens(backbone, data, [12], probes=("pixels", "class"), baseline=False, label=name,
                              batch_size=32, cache=ctx.cache, patch_groups={"top-norm": top, "rest": ~top}).rows
        out["rows"] += semantics + [r for r in groups if r.get("group") in ("top-norm", "rest")]
        if name == model_name:
            judgement = judge_layers(claim("S2-semantics"), semantics, model=name, metric="class_top1",
                                     group="patch", a_layer=12, b_layer=3, scope=where,
                                     readings={"6-3": (6, 3), "12-0": (12, 0)} if not ctx.quick else None)
            judgement.measure = "class top-1 from one patch token"
            out["claims"].append(judgement.to_json())
            for cid, metric in (("R8-local", "pixels_mse"), ("R8-global", "class_top1")):
                found = judge_groups(claim(cid), groups, model=name, metric=metric, layer=12, a_group="top-norm",
                                     b_group="rest", scope=f"{registers_where}; group: {STAND_IN}",
                                     a_label="top-5 norm tokens (stand-in)", b_label="the other patch tokens")
                out["claims"].append(on_stand_in(found.to_json(), mode.separate))
        out["r9"][name] = _r9(ctx, backbone, data, top, name, registers_where)
    separate = out["norms"][model_name]["separate"]
    out["claims"].append(on_stand_in(out["r9"][model_name].pop("judgement"), separate))
    out["r9"][twin_name].pop("judgement")
    out["rows"] = _without_units(out["rows"])
    return out


def _r9(ctx: Any, backbone: Any, data: Any, top: torch.Tensor, name: str, where: str) -> dict[str, Any]:
    """CLS alone against CLS + the stand-in group's mean (``vitscope.probes.cls_with_tokens``): image classifiers
    fitted on a seeded class-stratified half, paired on the other half's images (two one-sided tests with the
    registry's margin)."""
    feats = extract_features(backbone, data, [12], norm=True, batch_size=32, cache=ctx.cache)[12]
    rows = cls_with_tokens(feats, data.labels, {"top-norm": top}, label=name, held_fraction=0.5, seed=0)
    alone = find_row(rows, model=name, group="cls (top-norm images)", metric="image_top1")
    both = find_row(rows, model=name, group="cls+top-norm", metric="image_top1")
    tested = alone["n"]
    judgement = judge_with_group(claim("R9"), rows, model=name, group="top-norm",
                                 scope=f"{where}; group: {STAND_IN}; {len(data) - tested} fitting and {tested} test "
                                       "images", a_label="CLS + mean of the stand-in group")
    return {"cls_top1": alone["value"], "cls_group_top1": both["value"], "test_images": tested,
            "disagree": float(np.mean(np.array(alone["units"]["sums"]) != np.array(both["units"]["sums"]))),
            "judgement": judgement.to_json()}


def on_stand_in(judged: dict[str, Any], separate: bool) -> dict[str, Any]:
    """An R8/R9 Judgement (JSON) measured on the stand-in group: without a separate high-norm mode the claim, about
    high-norm (artifact) tokens, is not testable (the registry's precondition, as ``vitscope.stats.verdict`` applies
    it); the stand-in's own verdict and reason are kept in ``details.stand_in``, its interval in place."""
    if separate:
        return judged
    stand_in = {"verdict": judged["verdict"], "reason": judged["reason"]}
    return judged | {"verdict": "not testable", "reason": NO_MODE, "details": {**judged.get("details", {}),
                                                                             "stand_in": stand_in}}


def _without_units(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "units"} for r in rows]


def cls_controls(ctx: Any, fit_in: dict, eval_in: dict, train: Any, held: Any, common: dict[str, Any],
                 difference: Any) -> dict[str, Any]:
    """with-minus-without at layers 4 and 12, 600 steps (lr 1e-2), 2 head seeds, when the concatenated vector is
    the CLS token, the image's mean patch token, another frame's CLS (each frame gets the CLS of the frame half the
    split away: a different stretch of the video), or the CLS with weight decay 1."""
    seeds = range(ctx.scale(2, 1))
    steps = ctx.scale(600, 60)
    out: dict[str, Any] = {"steps": steps}
    for layer in [layer for layer in fit_in if layer in (4, 12)]:
        variants = {
            "CLS": (fit_in[layer].cls, eval_in[layer].cls),
            "mean patch token": (fit_in[layer].patches.float().mean(1), eval_in[layer].patches.float().mean(1)),
            "another frame's CLS": (fit_in[layer].cls.roll(len(fit_in[layer]) // 2, 0),
                                    eval_in[layer].cls.roll(len(eval_in[layer]) // 2, 0))}
        out[layer] = {}
        for name, (fit_cls, eval_cls) in variants.items():
            fitted = HeadInputs(fit_in[layer].patches, fit_in[layer].grid, fit_cls)
            evaluated = HeadInputs(eval_in[layer].patches, eval_in[layer].grid, eval_cls)
            fits = [fit_heads({layer: fitted}, train.targets, "segmentation", steps=steps, batch_size=16, lr=1e-2,
                              loss_points=1024, seed=s, **common) for s in seeds]
            out[layer][name] = difference(fits, {layer: evaluated}, held, layer)
        fits = [fit_heads({layer: fit_in[layer]}, train.targets, "segmentation", steps=steps, batch_size=16,
                          lr=1e-2, weight_decay=1.0, loss_points=1024, seed=s, **common) for s in seeds]
        out[layer]["CLS, weight decay 1"] = difference(fits, eval_in, held, layer)
    return out


def _class_fractions(data: Any) -> torch.Tensor:
    """(images, classes) share of each image's labelled pixels in each class."""
    rows = []
    for target in data.targets:
        valid = target[target != data.ignore_index]
        rows.append(torch.bincount(valid.flatten(), minlength=data.num_classes).double() / max(1, valid.numel()))
    return torch.stack(rows)


def cls_content(fit_in: dict, eval_in: dict, train: Any, held: Any) -> dict[str, Any]:
    """What a frame's CLS says about its content: ridge regression (penalty chosen on held-out training frames)
    from CLS, and from the mean patch token, to the frame's class fractions; R² on the evaluation frames against
    predicting the training mean. Also how far the evaluation frames' CLS lies from the training frames' (mean
    standardised distance, per channel)."""
    y_fit, y_eval = _class_fractions(train).float(), _class_fractions(held).float()
    base = float(((y_eval - y_fit.mean(0)) ** 2).sum())
    out = {}
    for layer in fit_in:
        found = {}
        for name, (a, b) in {"CLS": (fit_in[layer].cls, eval_in[layer].cls),
                             "mean patch token": (fit_in[layer].patches.float().mean(1),
                                                  eval_in[layer].patches.float().mean(1))}.items():
            reg = fit_regressor(a.float(), y_fit)
            found[name] = 1 - float(((reg.predict(b.float()).cpu() - y_eval) ** 2).sum()) / base
        mean, std = fit_in[layer].cls.float().mean(0), fit_in[layer].cls.float().std(0).clamp(min=1e-6)
        found["eval_cls_shift_sd"] = float(((eval_in[layer].cls.float().mean(0) - mean) / std).abs().mean())
        out[layer] = found
    return out
