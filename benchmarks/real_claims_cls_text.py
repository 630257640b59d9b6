"""The +CLS investigation's words on docs/results/real-claims.md (``benchmarks/real_claims_text.py`` renders the
rest): each explanation of the first measurement's drop judged by the numbers it states."""

from __future__ import annotations

import math
from typing import Any

import real_claims_page as page


def _within_video(camvid: dict[str, Any] | None) -> dict[int, float]:
    """Per layer, the best with-CLS minus the best without-CLS held-out mIoU of the sweep: frames of the training
    video the heads did not fit (no interval: one split, one seed)."""
    if not camvid:
        return {}
    best: dict[tuple[int, bool], float] = {}
    for s in camvid["settings"].get("sweep", {}).get("scores", []):
        if s["key"][0] == page.MODEL:
            key = (s["key"][1], s["with_cls"])
            best[key] = max(best.get(key, -math.inf), s["miou"])
    return {layer: best[layer, True] - best[layer, False] for layer, cls in best if cls and (layer, False) in best}


def _layers(layers: list[int]) -> str:
    return ("layer" + ("s " if len(layers) > 1 else " ") + ", ".join(map(str, layers))) if layers else "no layer"


def _sweep_words(stage: dict[str, Any], camvid: dict[str, Any] | None) -> tuple[str, str] | None:
    """The learning-rate explanation, judged at layer 4 (the first measurement's layer) and across layers."""
    s3 = {c["layer"]: c for c in (camvid or {}).get("claims", []) if c["claim_id"] == "S3"}
    if 4 not in s3:
        return None
    chosen = {(c["key"][1], c["with_cls"]): (c["lr"], c["weight_decay"]) for c in
              (camvid or {}).get("settings", {}).get("sweep", {}).get("chosen", []) if c["key"][0] == page.MODEL}
    fixed = _get(stage["steps"], 1000) or _get(stage["steps"], max(int(k) for k in stage["steps"]))
    swept, below = s3[4], [layer for layer, c in sorted(s3.items()) if c["ci95_high"] < 0]
    decay = (_get(stage["controls"], 4) or {}).get("CLS, weight decay 1")
    own = (_get(stage["controls"], 4) or {}).get("CLS")
    wide, narrow = chosen.get((4, True)), chosen.get((4, False))
    words = (f"at layer 4 the same 1000 steps with one rate (1e-2, weight decay 1e-4) give {page.interval(fixed)}; "
             f"with each head's own pair, chosen on held-out training frames (the wide head: learning rate "
             f"{wide[0]:g}, weight decay {wide[1]:g}; the narrow one: {narrow[0]:g}, {narrow[1]:g}), "
             f"{page.interval(swept)}" if wide and narrow else f"with each head's own pair: {page.interval(swept)}")
    if decay and own:
        words += (f"; weight decay 1 on the one rate takes the drop from {page.signed(own['difference'])} to "
                  f"{page.signed(decay['difference'])}")
    closes = swept["ci95_low"] <= 0 <= swept["ci95_high"] and fixed["high"] < 0
    verdict = "**supported at layer 4**" if closes else "**ruled out as the cause**"
    rest = (f". With swept heads the drop remains at {_layers(below)}" if below else
            ". With swept heads no layer keeps a drop")
    return ("one learning rate for a head twice as wide", f"{verdict}: {words}{rest}")


def cls_explanations(stage: dict[str, Any], camvid: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(explanation, what the measurements say about it), each sentence chosen by the numbers it states."""
    first, steps, scale = _get(stage["first"], 4), stage["steps"], stage["scale"]
    out = [("chance (62 frames, one seed)",
            (f"**ruled out**: the first protocol repeated with {first['seeds']} head seeds gives "
             f"{page.num(first['without']['difference'])} -> {page.num(first['with']['difference'])} mIoU at layer "
             f"4, {page.interval(first)}, an interval over frames and seeds that excludes zero"
             if first["high"] < 0 else
             f"**cannot be excluded**: the first protocol repeated with {first['seeds']} head seeds gives "
             f"{page.interval(first)} at layer 4"))]
    counts = sorted(int(k) for k in steps)
    longest, shortest = _get(steps, counts[-1]), _get(steps, counts[0])
    trend = ", ".join(f"{page.signed(_get(steps, n)['difference'])} at {n}" for n in counts)
    if longest["high"] < 0 and abs(longest["difference"]) < abs(shortest["difference"]):
        said = (f"**part of it, not all**: at one learning rate the drop shrinks with steps ({trend} steps) but at "
                f"{counts[-1]} steps it is still {page.interval(longest)}")
    else:
        said = (f"**{'supported' if longest['high'] >= 0 else 'ruled out'}**: with-minus-without is {trend} steps "
                f"({page.interval(longest)} at {counts[-1]})")
    out.append(("under-training (40 optimiser steps)", said))
    sweep = _sweep_words(stage, camvid)
    if sweep:
        out.append(sweep)
    raw, times = scale["raw"], scale["cls_times_100"]
    same = abs(raw["difference"] - times["difference"]) < 2 * max(raw.get("se", 0), times.get("se", 0), 1e-9)
    out.append(("the CLS token's scale beside the patches'",
                (f"**ruled out**: the head standardises every input channel (the CLS token's norm is "
                 f"{scale['cls_norm_over_patch_norm']:.2f} times the mean patch token's at layer 4), and the CLS "
                 f"token times 100 gives {page.interval(times)} against {page.interval(raw)} as it is" if same else
                 f"**matters**: the CLS token times 100 gives {page.interval(times)} against {page.interval(raw)}")))
    out.append(("the model (what its CLS token carries)", _model_words(stage, camvid)))
    return out


def _model_words(stage: dict[str, Any], camvid: dict[str, Any] | None) -> str:
    """The model explanation: where the drop survives every fitting choice, and what the controls say."""
    s3 = {c["layer"]: c for c in (camvid or {}).get("claims", []) if c["claim_id"] == "S3"}
    firm = [layer for layer, c in sorted(s3.items())
            if c["ci95_high"] < 0 and _get((camvid or {}).get("blocked", {}), layer)["high"] < 0]
    parts = []
    if firm:
        parts.append(f"at {_layers(firm)} the drop survives the sweep, the head seeds and the blocked interval "
                     "(S3 table)")
    controls = {k: v for k, v in stage["controls"].items() if k != "steps"}
    for layer, found in sorted(controls.items(), key=lambda kv: int(kv[0])):
        cls, mean, other = (found.get(k) for k in ("CLS", "mean patch token", "another frame's CLS"))
        if cls and mean:
            parts.append(f"at layer {layer}, one rate, the frame's CLS gives {page.interval(cls)}, the frame's mean "
                         f"patch token in its place {page.interval(mean)}, another frame's CLS "
                         f"{page.interval(other)}" if other else "")
    content = stage.get("cls_content", {})
    if content:
        parts.append("a ridge regression from the CLS token to a frame's class fractions scores R² "
                     + ", ".join(f"{_get(content, layer)['CLS']:.2f} at layer {layer}" for layer in stage["layers"])
                     + " on the evaluation video (from the mean patch token: "
                     + ", ".join(f"{_get(content, layer)['mean patch token']:.2f}" for layer in stage["layers"])
                     + "), and the evaluation frames' CLS lies "
                     + ", ".join(f"{_get(content, layer)['eval_cls_shift_sd']:.1f}" for layer in stage["layers"])
                     + " training standard deviations from the training frames' (mean over channels)")
    within = _within_video(camvid)
    if within:
        parts.append("on held-out frames of the training video CLS changes the sweep's best mIoU by "
                     + ", ".join(f"{page.signed(v)} (layer {layer})" for layer, v in sorted(within.items()))
                     + " (one split, one seed, no interval)")
    harmless = [int(layer) for layer, found in controls.items() if found.get("CLS") and found.get("mean patch token")
                and found["CLS"]["high"] < 0 and found["CLS"]["difference"] < found["mean patch token"]["low"] <= 0
                <= found["mean patch token"]["high"]]  # within noise of zero, and clear of the CLS's own drop
    smaller = within and all(abs(within[layer]) < abs(s3[layer]["difference"]) for layer in firm if layer in within)
    verdict = "**supported at the deep layers**" if firm else "**not shown**"
    said = (f"{verdict}: " + "; ".join(p for p in parts if p) + ". Where the drop survives every fitting choice it "
            "belongs to this model's CLS token as a linear head reads it, trained on one video and scored on another")
    if harmless:
        said += (f", not to any concatenated global vector: the frame's mean patch token in its place costs nothing "
                 f"measurable at {_layers(sorted(harmless))}, its interval clear of the CLS's drop")
    if firm and smaller:
        said += "; on held-out frames of the training video the drop is smaller, so it grows with the change of video"
    return said + ". Whether that is the saliency fine-tuning or DINO's CLS token in general, one model cannot say"


def cls_reason(stage: dict[str, Any], camvid: dict[str, Any] | None = None) -> str:
    """One paragraph: which explanation of the first measurement's drop the numbers support."""
    found = dict(cls_explanations(stage, camvid))
    supported = [name for name, said in found.items() if said.startswith(("**supported", "**part", "**matters",
                                                                           "**cannot"))]
    ruled = [name for name, said in found.items() if said.startswith("**ruled")]
    return (f"supported by the measurements: {'; '.join(supported) or 'none'}; ruled out: {'; '.join(ruled) or 'none'}"
            " (each with its numbers in 'Why +CLS lowered mIoU' below).")


def _get(mapping: dict, key: Any) -> Any:
    return mapping.get(str(key), mapping.get(key)) if isinstance(mapping, dict) else None


def cls_investigation(stage: dict[str, Any], camvid: dict[str, Any] | None) -> list[str]:
    out = ["## Why +CLS lowered mIoU in the first measurement", "",
           "The first measurement (issue 44: 20 epochs at batch 128, about 40 optimiser steps, learning rate 1e-2, "
           "one head seed) gave 24.0 -> 18.2 mIoU at layer 4 and 17.6 -> 15.1 at layer 12. Five explanations were on "
           "the table; each was tested on the same cached features.", ""]
    rows = []
    for layer in stage["layers"]:
        f = _get(stage["first"], layer)
        rows.append([str(layer), page.num(f["without"]["difference"]), page.num(f["with"]["difference"]),
                     page.interval(f), page.interval(f.get("blocked", f)),
                     f"{f['train_loss_without']:.3f} / {f['train_loss_with']:.3f}"])
    out += ["**1. Chance (62 frames, one seed).** The first protocol, repeated with "
            f"{_get(stage['first'], stage['layers'][0])['seeds']} head seeds:", "",
            *page.table(["layer", "mIoU without", "mIoU with", "with - without (95 %)", "blocked (95 %)",
                         "training loss without / with"], rows)]
    steps = stage["steps"]
    rows = [[str(k), page.num(v["without"]["difference"]), page.num(v["with"]["difference"]), page.interval(v),
             f"{v['change_without']:+.1%} / {v['change_with']:+.1%}"] for k, v in sorted(steps.items(),
                                                                                       key=lambda kv: int(kv[0]))]
    counts = sorted(int(k) for k in stage["steps"])
    out += [f"**2. Under-training.** Layer 4, learning rate 1e-2, batch 16, 1024 loss points, from {counts[0]} to "
            f"{counts[-1]} steps, {_get(stage['steps'], counts[0])['seeds']} head seeds "
            "(the change of the training loss over the second half is the convergence check of `vitscope probe`):",
            "", *page.table(["steps", "mIoU without", "mIoU with", "with - without (95 %)",
                             "loss change, second half (without / with)"], rows)]
    sweep = stage.get("sweep") or {}
    chosen = [c for c in sweep.get("chosen", []) if c["key"][0] == page.MODEL]
    if chosen:
        rows = [[str(c["key"][1]), "with" if c["with_cls"] else "without", f"{c['lr']:g}", f"{c['weight_decay']:g}"]
                for c in sorted(chosen, key=lambda c: (c["key"][1], c["with_cls"]))]
        out += ["**3. One learning rate for a head twice as wide.** The sweep (chosen on held-out training frames, "
                "never the evaluation frames) picked, per head:", "",
                *page.table(["layer", "CLS", "learning rate", "weight decay"], rows),
                "The S3 table above is what the heads give with their own choices.", ""]
    scale = stage["scale"]
    out += ["**4. The CLS token's scale beside the patches'.** The head standardises every input channel with the "
            "training set's statistics (the CLS half with the CLS tokens'), so a scale cannot reach it: at layer 4 "
            f"the CLS token's norm is {scale['cls_norm_over_patch_norm']:.2f} times the mean patch token's, and "
            f"multiplying the CLS token by 100 gives {page.interval(scale['cls_times_100'])} against "
            f"{page.interval(scale['raw'])} (one seed, 1000 steps).", ""]
    rows = []
    controls = {k: v for k, v in stage["controls"].items() if k != "steps"}
    for layer, found_at in sorted(controls.items(), key=lambda kv: int(kv[0])):
        for name, found in found_at.items():
            rows.append([str(layer), name, page.num(found["without"]["difference"]),
                         page.num(found["with"]["difference"]), page.interval(found)])
    content = stage.get("cls_content", {})
    crows = [[str(layer), f"{_get(content, layer)['CLS']:.2f}", f"{_get(content, layer)['mean patch token']:.2f}",
              f"{_get(content, layer)['eval_cls_shift_sd']:.2f}"] for layer in stage["layers"]]
    out += [f"**5. The model, or what the concatenated vector carries.** {stage['controls'].get('steps', 1000)} "
            f"steps, learning rate 1e-2, {next(iter(next(iter(controls.values())).values()))['seeds']} head seeds, "
            "with the "
            "frame's CLS, the frame's mean patch token, another frame's CLS (the frame half the split away), or the "
            "CLS under weight decay 1:", "",
            *page.table(["layer", "concatenated", "mIoU without", "mIoU with", "with - without (95 %)"], rows),
            "What the CLS token knows about a frame's content: R² of a ridge regression from it (and from the mean "
            "patch token) to the frame's class fractions, fitted on the training frames and scored on the evaluation "
            "frames (1 = every fraction right, 0 = no better than the training mean), and how far the evaluation "
            "frames' CLS lies from the training frames' (mean over channels of the shift in training standard "
            "deviations):", "",
            *page.table(["layer", "R² from CLS", "R² from mean patch", "CLS shift, evaluation vs training (sd)"],
                        crows),
            "**What is true.**", "",
            *(f"- {name}: {said}." for name, said in cls_explanations(stage, camvid)), ""]
    return out
