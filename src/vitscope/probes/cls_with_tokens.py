"""Whether chosen patch tokens add to CLS for the image class: a linear image classifier on CLS alone against one on
CLS concatenated with the mean of each image's chosen patch tokens (e.g. its high-norm tokens), both fitted on the
same images and scored on the same held-out images, outcome per image (the registers reassessment's "adding the
high-norm tokens to the classifier adds little beyond CLS", R9 in ``vitscope.claims``).

Images are split once into fit and held-out halves (``stratified_split``, seeded: the same split for every model of
a dataset, so that two models' outcomes pair by image). Rows (the shared schema, with per-image ``units``: 1 for a
right answer, 0 for a wrong one):

* ``cls`` / ``image_top1``: CLS alone, fitted on every fit image, on every held-out image;
* ``cls (NAME images)`` / ``image_top1``: CLS alone, fitted and scored on the images with a chosen token only;
* ``cls+NAME`` / ``image_top1``: CLS concatenated with the mean chosen token, on the same images;
* ``chance`` rows: the majority fit class on the same held-out images.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from vitscope.probes.baselines import majority_top1
from vitscope.probes.features import LayerFeatures
from vitscope.probes.linear import fit_classifier, stratified_split
from vitscope.probes.results import CHANCE, row

MIN_IMAGES = 4  # images with a chosen token on each side below which the pair is not fitted


def masked_mean(patches: Tensor, mask: Tensor, chunk: int = 512) -> Tensor:
    """(N, D) float32 mean of each image's chosen patch tokens: ``patches`` (N, P, D), ``mask`` (N, P) boolean;
    zeros for an image with none."""
    out = []
    for start in range(0, len(patches), chunk):
        picked = mask[start : start + chunk].float()
        total = (patches[start : start + chunk].float() * picked[..., None]).sum(dim=1)
        out.append(total / picked.sum(dim=1, keepdim=True).clamp(min=1))
    return torch.cat(out) if out else torch.zeros(0, patches.shape[-1])


def _correct(features: Tensor, labels: Tensor, fit: Tensor, held: Tensor, options: Mapping[str, Any]) -> Tensor:
    """Per held-out image, 1.0 when the classifier fitted on ``fit`` names its class, else 0.0."""
    num_classes = int(labels.max()) + 1
    classifier = fit_classifier(features[fit], labels[fit], num_classes, **options)
    return (classifier.predict(features[held]).cpu() == labels[held]).double()


def _rows(label: str, layer: int, group: str, correct: Tensor, held: Tensor, chance: float) -> list[dict[str, Any]]:
    units = {"images": held.tolist(), "sums": correct.tolist(), "counts": [1] * len(held)}
    common = {"layer": layer, "layer_kind": "token", "group": group, "metric": "image_top1", "n": len(held)}
    return [row(model=label, value=float(correct.mean()), **common) | {"units": units},
            row(model=CHANCE, value=chance, **common) | {"chance_for": label}]


def cls_with_tokens(features: LayerFeatures, labels: Tensor, masks: Mapping[str, Tensor | None], *, label: str,
                    held_fraction: float = 0.5, seed: int = 0, fit_options: Mapping[str, Any] | None = None
                    ) -> list[dict[str, Any]]:
    """The rows of the module docstring at one token layer: ``features`` of every image, ``labels`` (N,) their
    classes, ``masks`` {NAME: (N, patches) boolean or None}; nothing for a model without CLS."""
    if not features.has_cls:
        return []
    labels = torch.as_tensor(labels).long().cpu()
    options = {"seed": seed, **(fit_options or {})}
    fit, held = stratified_split(labels, held_fraction, seed)
    cls = features.cls.float()
    rows = _rows(label, features.layer, "cls", _correct(cls, labels, fit, held, options), held,
                 majority_top1(labels[fit], labels[held]))
    for name, mask in masks.items():
        if mask is None:
            continue
        has = mask.bool().cpu().any(dim=1)
        fit_with, held_with = fit[has[fit]], held[has[held]]
        if min(len(fit_with), len(held_with)) < MIN_IMAGES:
            continue
        chance = majority_top1(labels[fit_with], labels[held_with])
        both = torch.cat([cls, masked_mean(features.patches, mask.bool().cpu())], dim=1)
        rows += _rows(label, features.layer, f"cls ({name} images)",
                      _correct(cls, labels, fit_with, held_with, options), held_with, chance)
        rows += _rows(label, features.layer, f"cls+{name}", _correct(both, labels, fit_with, held_with, options),
                      held_with, chance)
    return rows
