"""Image-level probes on frozen features: linear (logistic regression) and kNN (DINO's weighted vote).

Both read one image feature per image at each token layer: ``pool="cls"`` (the CLS token), ``"mean"`` (the mean
patch token) or ``"both"`` (the two concatenated); ``dino_last4=True`` adds DINO's linear protocol for comparison
with published numbers (CLS tokens of the last four blocks concatenated, reported at the last layer). Every result
also holds the same probe on a randomly initialised copy of the backbone and the majority-class level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.data import ImageDataset
from vitscope.metrics.knn import knn_top1
from vitscope.probes.baselines import majority_top1, random_twin
from vitscope.probes.features import LayerFeatures, depth_of, extract_features, parse_layers
from vitscope.probes.linear import fit_classifier
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row
from vitscope.probes.settings import ImageProbeSettings

DINO_GROUP = "dino-last4"
# A scorer maps (train features, train labels, eval features, eval labels, classes) to a fraction in [0, 1].
Scorer = Callable[[Tensor, Tensor, Tensor, Tensor, int], float]


def dino_last4_layers(depth: int) -> list[int]:
    """The token layers of DINO's linear protocol for ViT-S: the outputs of the last four blocks (every block of a
    model with fewer than four)."""
    return list(range(max(1, depth - 3), depth + 1))


def dino_last4_cls(features: Mapping[int, LayerFeatures], depth: int) -> Tensor:
    """DINO's linear-protocol feature (N, 4 D): the CLS tokens of ``dino_last4_layers(depth)`` (read after the
    final norm, as DINO's ``get_intermediate_layers``) concatenated in block order."""
    return torch.cat([features[layer].pooled("cls") for layer in dino_last4_layers(depth)], dim=1)


def _image_features(backbone: nn.Module, train: ImageDataset, eval_set: ImageDataset, layers: list[int],
                    pool: str, dino_last4: bool, options: dict[str, Any]
                    ) -> dict[tuple[int, str], tuple[Tensor, Tensor]]:
    """(layer, group) -> (train features, eval features), each (N, D) float32."""
    depth = depth_of(backbone)
    needed = sorted(set(layers) | (set(dino_last4_layers(depth)) if dino_last4 else set()))
    both = [extract_features(backbone, data, needed, **options) for data in (train, eval_set)]
    out = {(layer, pool): (both[0][layer].pooled(pool), both[1][layer].pooled(pool)) for layer in layers}
    if dino_last4:
        out[(depth, DINO_GROUP)] = tuple(dino_last4_cls(f, depth) for f in both)
    return out


def _image_probe(kind: str, metric: str, scorer: Scorer, model: nn.Module, train: ImageDataset,
                 eval_set: ImageDataset, layers: str | Sequence[int | str], settings: ImageProbeSettings,
                 recorded: dict[str, Any]) -> ProbeResult:
    """Every layer's ``scorer`` value for the model, its random-init twin (``settings.baseline``) and the majority
    class; ``recorded``: the probe's own settings for the result."""
    if train.num_classes != eval_set.num_classes:
        raise ValueError(f"train has {train.num_classes} classes but eval has {eval_set.num_classes}; "
                         "use two splits of the same dataset")
    wanted = parse_layers(layers, depth_of(model))
    label, pool = settings.label, settings.pool
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, settings.seed))]
                                 if settings.baseline else [])
    rows = []
    for name, backbone in models:
        features = _image_features(backbone, train, eval_set, wanted, pool, settings.dino_last4,
                                   settings.feature_options())
        for (layer, group), (x_train, x_eval) in features.items():
            value = scorer(x_train, train.labels, x_eval, eval_set.labels, train.num_classes)
            rows.append(row(model=name, layer=layer, layer_kind="token", group=group, metric=metric, value=value,
                            n=len(eval_set)))
    chance = majority_top1(train.labels, eval_set.labels)
    for layer, group in features:
        rows.append(row(model=CHANCE, layer=layer, layer_kind="token", group=group, metric=metric, value=chance,
                        n=len(eval_set)))
    return ProbeResult(kind, rows, {"model": label, "layers": wanted, "pool": pool, "dino_last4": settings.dino_last4,
                                    "train_images": len(train), "eval_images": len(eval_set), "seed": settings.seed,
                                    "norm": settings.norm, **recorded})


def linear_probe(model: nn.Module, train: ImageDataset, eval_set: ImageDataset,
                 layers: str | Sequence[int | str] = "last", settings: ImageProbeSettings | None = None
                 ) -> ProbeResult:
    """Linear-probe top-1 on ``eval_set`` of a logistic regression fitted on ``train`` features, per token layer.

    The learning rate and weight decay are swept on a held-out 20 % of ``train`` (``settings.fit_options`` go to
    ``vitscope.probes.linear.fit_classifier``), the best refitted on all of ``train``."""
    settings = settings or ImageProbeSettings()
    options = {"seed": settings.seed, "device": settings.device, **(settings.fit_options or {})}

    def scorer(x_train: Tensor, y_train: Tensor, x_eval: Tensor, y_eval: Tensor, classes: int) -> float:
        return fit_classifier(x_train, y_train, classes, **options).top1(x_eval, y_eval)

    return _image_probe("linear", "top1", scorer, model, train, eval_set, layers, settings,
                        {"fit_options": {k: v for k, v in options.items() if k != "device"}})


def knn_probe(model: nn.Module, train: ImageDataset, eval_set: ImageDataset,
              layers: str | Sequence[int | str] = "last", settings: ImageProbeSettings | None = None) -> ProbeResult:
    """Weighted kNN top-1 (``settings.k`` neighbours by cosine similarity, vote weight exp(similarity /
    ``settings.temperature``)) of ``eval_set`` against the ``train`` features, per token layer
    (``vitscope.metrics.knn``); DINO's last-4 protocol is the linear probe's only."""
    settings = (settings or ImageProbeSettings()).replace(dino_last4=False)

    def scorer(x_train: Tensor, y_train: Tensor, x_eval: Tensor, y_eval: Tensor, classes: int) -> float:
        return knn_top1(x_train.to(settings.device), y_train, x_eval, y_eval, classes, k=settings.k,
                        temperature=settings.temperature)

    return _image_probe("knn", "knn_top1", scorer, model, train, eval_set, layers, settings,
                        {"k": settings.k, "temperature": settings.temperature})
