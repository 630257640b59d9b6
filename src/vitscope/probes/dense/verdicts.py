"""The claim a dense probe with and without CLS judges on one model: S3 of seed 001, "the CLS token holds
complementary global information: concatenated to the patch features it helps dense prediction substantially"
(``vitscope.claims.claim("S3")``), per layer.

At each layer the with-CLS head's score minus the without-CLS head's (mIoU; depth: RMSE, where lower is better, so
the claim's direction is a negative difference) is judged by the one rule on its 95 % interval over evaluation
images and head seeds (``vitscope.probes.dense.intervals``; ``vitscope.claims.judge.judge_estimate``). The random-init
twin's difference and the chance level stay beside it in ``details`` and ``rows``; the claim is the model's.
"""

from __future__ import annotations

from typing import Any

from vitscope.claims import claim as registry_claim
from vitscope.claims.judge import judge_estimate
from vitscope.probes.dense.scores import DenseProbeResult
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX

CLAIM = "S3"
MAIN = {"segmentation": ("miou", "pixel_accuracy"), "depth": ("rmse", "rmse_pooled", "abs_rel", "delta1")}


def cls_judgements(result: DenseProbeResult, model: str, *, scope: str, blocks: int | None = None
                   ) -> list[dict[str, Any]]:
    """S3's judgement (``Judgement.to_json()``) at every layer where ``model`` has heads with and without CLS."""
    claim = registry_claim(CLAIM)
    task = result.task
    metric = "miou" if task == "segmentation" else "rmse"
    twin = model + RANDOM_SUFFIX
    out = []
    layers = sorted({layer for name, layer, _ in result.per_image if name == model})
    for layer in layers:
        if (model, layer, True) not in result.per_image or (model, layer, False) not in result.per_image:
            continue
        found = result.interval((model, layer, True), (model, layer, False), metric=metric, blocks=blocks)
        details: dict[str, Any] = {"image_se": found.image_se, "seed_se": found.seed_se, "df": found.df,
                                   "per_seed": found.per_seed, "seeds": found.seeds, "groups": found.groups}
        if (twin, layer, True) in result.per_image and (twin, layer, False) in result.per_image:
            floor = result.interval((twin, layer, True), (twin, layer, False), metric=metric, blocks=blocks)
            details["random_init"] = {"difference": floor.difference, "ci95_low": floor.low,
                                      "ci95_high": floor.high}
        rows = [r for r in result.rows if r["layer"] == layer and r["metric"] in MAIN[task]
                and r["model"] in (model, twin, CHANCE)]
        judgement = judge_estimate(
            claim, found.difference, found.low, found.high, method=found.method, n_a=found.images,
            n_b=found.images, unit="images", sign=1 if task == "segmentation" else -1, scope=scope, layer=layer,
            rows=rows, measure=metric if task == "segmentation" else f"depth {metric}",
            a_label="with CLS", b_label="without CLS", details=details)
        out.append(judgement.to_json())
    return out


def default_scope(result: DenseProbeResult, model: str) -> str:
    """The model, data and sample a verdict holds for, and how they differ from the paper's."""
    settings = result.settings
    seeds = settings.get("head_seeds", 1)
    return (f"{model}, {settings.get('dataset')} ({settings.get('train_images')} training and "
            f"{settings.get('eval_images')} evaluation images, {settings.get('input_side')} px), linear head "
            f"(standardised tokens + 1x1), {settings.get('steps')} steps, {seeds} head seed{'s' * (seeds > 1)}; "
            "the paper: DINO (v1) ViT-S/16 pretrained 200 epochs on ImageNet-1k, its own dense protocol")
