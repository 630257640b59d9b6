"""Image-level probes on frozen features: linear (logistic regression) and kNN (DINO's weighted vote).

Both read one image feature per image at each token layer: ``pool="cls"`` (the CLS token), ``"mean"`` (the mean
patch token) or ``"both"`` (the two concatenated); ``dino_last4=True`` adds DINO's linear protocol for comparison
with published numbers (CLS tokens of the last four blocks concatenated, reported at the last layer). Every result
also holds the same probe on a randomly initialised copy of the backbone and the majority-class level. Held-out
labels are matched to the training classes by name (``align_labels``); classes only one side has are said on
stderr and recorded in the result's settings (``classes``).
"""

from __future__ import annotations

import sys
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


def align_labels(train_classes: Sequence[str], eval_classes: Sequence[str], eval_labels: Tensor
                 ) -> tuple[Tensor, dict[str, Any]]:
    """The held-out labels (N,) as indices of the training classes, matched by class name (two folders list their
    classes each in their own order); an image of a class the training split lacks gets -1, which no prediction
    equals (scored as wrong). Also what was matched: ``aligned_by``, ``eval_only`` (class: images) and
    ``train_only`` class names. No class in common is refused in one line."""
    index = {name: i for i, name in enumerate(train_classes)}
    shared = [name for name in eval_classes if name in index]
    if not shared:
        raise ValueError(f"the training classes ({_names(train_classes)}) and the held-out classes "
                         f"({_names(eval_classes)}) share no name; use two splits of the same dataset")
    mapping = torch.tensor([index.get(name, -1) for name in eval_classes], dtype=torch.long)
    labels = torch.as_tensor(eval_labels).long()
    counts = torch.bincount(labels, minlength=len(eval_classes)).tolist()
    eval_only = {name: counts[i] for i, name in enumerate(eval_classes) if name not in index}
    train_only = [name for name in train_classes if name not in set(eval_classes)]
    return mapping[labels], {"aligned_by": "name", "eval_only": eval_only, "train_only": train_only}


def describe_classes(classes: dict[str, Any]) -> str:
    """One line on the classes only one side has."""
    parts = []
    if classes["eval_only"]:
        shown = ", ".join(f"{name} ({count} images)" for name, count in classes["eval_only"].items())
        parts.append(f"held-out classes not in training, scored as wrong: {shown}")
    if classes["train_only"]:
        parts.append(f"training classes not held out: {_names(classes['train_only'])}")
    return "; ".join(parts) + " (labels matched by class name)"


def _names(names: Sequence[str], limit: int = 8) -> str:
    return ", ".join(list(names)[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _image_probe(kind: str, metric: str, scorer: Scorer, model: nn.Module, train: ImageDataset,
                 eval_set: ImageDataset, layers: str | Sequence[int | str], settings: ImageProbeSettings,
                 recorded: dict[str, Any]) -> ProbeResult:
    """Every layer's ``scorer`` value for the model, its random-init twin (``settings.baseline``) and the majority
    class; ``recorded``: the probe's own settings for the result."""
    eval_labels, classes = align_labels(train.classes, eval_set.classes, eval_set.labels)
    if classes["eval_only"] or classes["train_only"]:
        print(f"vitscope: {kind} probe: {describe_classes(classes)}", file=sys.stderr)
    wanted = parse_layers(layers, depth_of(model))
    label, pool = settings.label, settings.pool
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, settings.seed))]
                                 if settings.baseline else [])
    rows = []
    for name, backbone in models:
        features = _image_features(backbone, train, eval_set, wanted, pool, settings.dino_last4,
                                   settings.feature_options())
        for (layer, group), (x_train, x_eval) in features.items():
            value = scorer(x_train, train.labels, x_eval, eval_labels, train.num_classes)
            rows.append(row(model=name, layer=layer, layer_kind="token", group=group, metric=metric, value=value,
                            n=len(eval_set)))
    chance = majority_top1(train.labels, eval_labels)
    for layer, group in features:
        rows.append(row(model=CHANCE, layer=layer, layer_kind="token", group=group, metric=metric, value=chance,
                        n=len(eval_set)))
    return ProbeResult(kind, rows, {"model": label, "layers": wanted, "pool": pool, "dino_last4": settings.dino_last4,
                                    "train_images": len(train), "eval_images": len(eval_set), "seed": settings.seed,
                                    "norm": settings.norm, "classes": classes, **recorded})


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
