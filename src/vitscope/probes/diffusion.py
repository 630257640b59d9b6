"""Semantic diffusion, measured: how much image-level (global) semantics sits in background patch tokens.

Per token layer (0 = embedding, l = block l):

* ``diffusion_top1`` (group ``background``): top-1 on held-out images of a logistic regression from one
  *background* patch token to its image's class, fitted on background tokens of the other images (images
  split in halves, seeded and stratified by class; at most ``max_tokens`` tokens per half, drawn at random);
  its learning-rate / weight-decay sweep also holds out whole images of the fit half, never single tokens;
* ``diffusion_cosine`` (group ``background``): the mean, over images with background, of the mean cosine
  similarity between the image's background patch tokens and its CLS token.

A background patch is one whose centre lies outside every object box or on a background mask pixel
(``vitscope.metrics.diffusion``). Higher means more global semantics leaked into tokens that locally show no
object; the sparse-attention paper (arXiv 2605.23868) predicts both are lower with entmax-1.5 than softmax.
Rows also hold the same measure on a randomly initialised twin and the chance level (majority class).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.analyze.inputs import model_input
from vitscope.data import ImageDataset
from vitscope.metrics.diffusion import background_cls_cosine, background_patches
from vitscope.probes.baselines import majority_top1, random_twin
from vitscope.probes.features import LayerFeatures, depth_of, extract_features, parse_layers
from vitscope.probes.linear import fit_classifier, stratified_split
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row

GROUP = "background"


def dataset_background(dataset: ImageDataset, grid: tuple[int, int]) -> Tensor:
    """(N, rows * cols) bool background patches of ``dataset`` on a token ``grid`` (its masks, else boxes)."""
    extras = dataset.extras
    if "masks" not in extras and "boxes" not in extras:
        raise ValueError(f"dataset {dataset.name!r} has no object masks or boxes, which semantic diffusion needs "
                         "to find background patches; use synthetic scenes or a dataset with masks or boxes")
    hw = tuple(dataset.images.shape[-2:])
    return background_patches(grid, hw, masks=extras.get("masks"), boxes=extras.get("boxes"))


def _pick_tokens(background: Tensor, images: Tensor, count: int, generator: torch.Generator
                 ) -> tuple[Tensor, Tensor]:
    """Up to ``count`` (image, patch) pairs drawn at random among the background patches of ``images``."""
    allowed = torch.zeros(len(background), dtype=torch.bool)
    allowed[images] = True
    pairs = (background & allowed[:, None]).nonzero()
    pick = pairs[torch.randperm(len(pairs), generator=generator)[:count]]
    return pick[:, 0], pick[:, 1]


def diffusion_scores(features: LayerFeatures, labels: Tensor, background: Tensor, *, max_tokens: int = 4096,
                     held_fraction: float = 0.5, seed: int = 0, device: torch.device | str = "cpu",
                     fit_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Semantic diffusion of one token layer's cached features.

    ``labels`` (N,) image classes; ``background`` (N, patches) bool. Returns ``top1`` (held-out class top-1
    from single background tokens, None when a half has fewer than 2 tokens), ``chance`` (majority class on
    the same held-out tokens), ``hits`` (0/1 per held-out token), ``fit`` (the classifier's settings: the chosen
    learning rate and weight decay and its ``sweep``, scored on fit-half images held out whole), ``cosine``
    (mean background-patch/CLS cosine over images with background, None without CLS), ``cosines`` (per image,
    NaN without background) and the counts ``fit_tokens``, ``held_tokens``, ``cosine_images``."""
    labels = torch.as_tensor(labels).long().cpu()
    background = torch.as_tensor(background).bool().cpu()
    patches = features.patches
    if tuple(background.shape) != tuple(patches.shape[:2]):
        raise ValueError(f"background mask {tuple(background.shape)} must be (images, patches) = "
                         f"{tuple(patches.shape[:2])}")
    out: dict[str, Any] = {"top1": None, "chance": None, "cosine": None}
    fit, held = stratified_split(labels, held_fraction, seed)
    generator = torch.Generator().manual_seed(seed)
    fi, fp = _pick_tokens(background, fit, max_tokens, generator)
    hi, hp = _pick_tokens(background, held, max_tokens, generator)
    out["fit_tokens"], out["held_tokens"] = len(fi), len(hi)
    if len(fi) >= 2 and len(hi) >= 1:
        num_classes = int(labels.max()) + 1
        clf = fit_classifier(patches[fi, fp].float(), labels[fi], num_classes, seed=seed, device=device,
                             groups=fi, **dict(fit_options or {}))  # the sweep holds out whole images
        out["fit"] = clf.settings
        hits = (clf.predict(patches[hi, hp].float()).cpu() == labels[hi]).int()
        out["top1"], out["hits"] = float(hits.float().mean()), hits.tolist()
        out["chance"] = majority_top1(labels[fi], labels[hi])
    if features.has_cls:
        per_image = background_cls_cosine(patches, features.cls, background)
        valid = ~per_image.isnan()
        out["cosine_images"], out["cosines"] = int(valid.sum()), per_image.tolist()
        out["cosine"] = float(per_image[valid].mean()) if valid.any() else None
    return out


def semantic_diffusion(model: nn.Module, dataset: ImageDataset, layers: str | Sequence[int | str] = "all", *,
                       max_tokens: int = 4096, held_fraction: float = 0.5, baseline: bool = True,
                       label: str = "model", norm: bool = True, batch_size: int = 64,
                       device: torch.device | str = "cpu", img_size: int | None = None, cache: Any = True,
                       seed: int = 0, progress: bool = True,
                       fit_options: Mapping[str, Any] | None = None) -> ProbeResult:
    """Semantic diffusion of ``model`` on ``dataset`` (which needs masks or boxes) at token ``layers``.

    ``fit_options`` go to ``fit_classifier`` (lrs, weight_decays, epochs); ``baseline`` adds a randomly
    initialised twin's rows; chance rows (majority class) are always added."""
    wanted = parse_layers(layers, depth_of(model))
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, seed))] if baseline else [])
    rows: list[dict[str, Any]] = []
    background = None
    for name, backbone in models:
        features = extract_features(backbone, dataset, wanted, norm=norm, batch_size=batch_size, device=device,
                                    img_size=img_size, cache=cache, progress=progress)
        if background is None:
            background = dataset_background(dataset, features[wanted[0]].grid)
        for layer in wanted:
            scores = diffusion_scores(features[layer], dataset.labels, background, max_tokens=max_tokens,
                                      held_fraction=held_fraction, seed=seed, device=device,
                                      fit_options=fit_options)
            common = {"layer": layer, "layer_kind": "token", "group": GROUP}
            if scores["top1"] is not None:
                rows.append(row(model=name, metric="diffusion_top1", value=scores["top1"],
                                n=scores["held_tokens"], **common))
                if name == label:
                    rows.append(row(model=CHANCE, metric="diffusion_top1", value=scores["chance"],
                                    n=scores["held_tokens"], **common))
            if scores["cosine"] is not None:
                rows.append(row(model=name, metric="diffusion_cosine", value=scores["cosine"],
                                n=scores["cosine_images"], **common))
    side = model_input(model, dataset, img_size)[0]
    settings = {"model": label, "layers": wanted, "max_tokens": max_tokens, "held_fraction": held_fraction,
                "norm": norm, "seed": seed, "input_side": side, "images": len(dataset),
                "background_patches": int(background.sum()) if background is not None else 0,
                "fit_options": dict(fit_options or {})}
    return ProbeResult("semantic-diffusion", rows, settings)
