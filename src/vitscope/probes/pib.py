"""Point-in-Box per layer (definition in ``vitscope.metrics.pib``) with its chance level beside it.

Scores: ``attention`` — CLS-to-patch attention averaged over heads, at attention layer l (inside block l, whose
queries are token layer l - 1), recorded with ``vitscope.record_attention``; ``norm`` — the L2 norm of each patch
token at token layer l before the final norm; ``cosine`` — cosine similarity of each patch token to the CLS token
at token layer l (after the final norm unless ``norm=False``). Boxes come from ``dataset.extras["boxes"]`` in the
dataset's pixels and are scaled to the model's input side.

``class``: the **class-evidence map** of token layer l (vitscope's score for spatial alignment, docs/definitions.md):
a linear classifier from single patch tokens to the image's class is fitted on one half of the images (seeded,
class-stratified; at most ``CLASS_TOKENS`` tokens, its learning rate and weight decay swept on held-out images of
that half), and each patch of the other half is scored by its logit of the image's own class. PiB then asks whether
the patch that carries the most evidence for the class lies on the object. Where the class is carried by the
object's own patches it does; where global semantics have spread over the background (semantic diffusion, seed
001), the top patch falls anywhere and PiB drops towards its chance level. Rows of this score count the held-out
half only, and carry per-image hits (``units``) so that layers can be compared image by image.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitscope.analyze.inputs import model_batches, model_input
from vitscope.data import ImageDataset
from vitscope.metrics.pib import point_in_box
from vitscope.metrics.units import per_image
from vitscope.models import token_layout
from vitscope.probes.baselines import random_twin
from vitscope.probes.features import depth_of, extract_features, parse_layers
from vitscope.probes.linear import fit_classifier, stratified_split
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row
from vitscope.record import record_attention

SCORES = ("attention", "norm", "cosine", "class")
CLASS_TOKENS = 4096  # patch tokens the class-evidence classifier is fitted on, per layer


def scaled_boxes(dataset: ImageDataset, side: int) -> Tensor:
    """The dataset's boxes (N, 4) or (N, K, 4) in pixels of the model input (side x side)."""
    boxes = dataset.extras.get("boxes")
    if boxes is None:
        raise ValueError(f"dataset {dataset.name!r} has no boxes; Point-in-Box needs box annotations "
                         "(synthetic scenes, tiny-imagenet, VOC XML, ImageNet validation XML)")
    height, width = dataset.images.shape[-2:]
    scale = torch.tensor([side / width, side / height, side / width, side / height])
    return boxes.float() * scale


@torch.no_grad()
def attention_scores(model: nn.Module, dataset: ImageDataset, layers: Sequence[int], *, batch_size: int = 64,
                     device: torch.device | str = "cpu", img_size: int | None = None) -> dict[int, Tensor]:
    """CLS-to-patch attention averaged over heads, (N, patches), per attention layer l (1-based)."""
    layout = token_layout(model)
    if not layout.has_cls:
        raise ValueError("attention scores need a CLS token; use score='norm' for a model without one")
    model.to(device).eval()
    chunks: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    for images, _ in model_batches(model, dataset, batch_size, device, img_size):
        with record_attention(model, layers=[layer - 1 for layer in layers], keep="maps") as rec:
            model(images)
        for layer, probs in zip(sorted(layers), rec.maps, strict=True):
            chunks[layer].append(probs[:, :, 0, layout.num_prefix_tokens :].float().mean(1).cpu())
    return {layer: torch.cat(parts) for layer, parts in chunks.items()}


def _token_scores(model: nn.Module, dataset: ImageDataset, layers: list[int], score: str, norm: bool,
                  options: dict[str, Any]) -> dict[int, Tensor]:
    features = extract_features(model, dataset, layers, norm=norm and score == "cosine", **options)
    out = {}
    for layer, feats in features.items():
        patches = feats.patches.float()
        if score == "norm":
            out[layer] = patches.norm(dim=-1)
        else:
            if not feats.has_cls:
                raise ValueError("cosine scores need a CLS token; use score='norm' for a model without one")
            out[layer] = F.cosine_similarity(patches, feats.cls.float()[:, None], dim=-1)
    return out


def pib_probe(model: nn.Module, dataset: ImageDataset, layers: str | Sequence[int | str] = "all", *,
              score: str = "attention", norm: bool = True, baseline: bool = True, label: str = "model",
              batch_size: int = 64, device: torch.device | str = "cpu", img_size: int | None = None,
              cache: Any = True, seed: int = 0, progress: bool = True) -> ProbeResult:
    """PiB (percent) and its chance level per layer; rows also count tied images (``metric="pib_ties"``)."""
    if score not in SCORES:
        raise ValueError(f"score={score!r} is unknown; use {', '.join(SCORES)}")
    wanted = parse_layers(layers, depth_of(model))
    if score == "attention":
        wanted = [layer for layer in wanted if layer > 0]
        if not wanted:
            raise ValueError("attention layers are numbered 1..L (layer l is inside block l); layer 0 has none")
    layout = token_layout(model)
    side = model_input(model, dataset, img_size)[0]
    boxes = scaled_boxes(dataset, side)
    kind = "attention" if score == "attention" else "token"
    models = [(label, model)] + ([(label + RANDOM_SUFFIX, random_twin(model, seed))] if baseline else [])
    rows = []
    images = torch.arange(len(dataset))
    if score == "class":
        fit, images = stratified_split(dataset.labels, 0.5, seed)
        images = images.sort().values
    for name, backbone in models:
        if score == "attention":
            scores = attention_scores(backbone, dataset, wanted, batch_size=batch_size, device=device,
                                      img_size=img_size)
        elif score == "class":
            scores = class_evidence(backbone, dataset, wanted, fit, images, norm=norm, seed=seed, device=device,
                                    options={"batch_size": batch_size, "device": device, "img_size": img_size,
                                             "cache": cache, "progress": progress})
        else:
            scores = _token_scores(backbone, dataset, wanted, score, norm, {
                "batch_size": batch_size, "device": device, "img_size": img_size, "cache": cache,
                "progress": progress})
        for layer in wanted:
            found = point_in_box(scores[layer][images] if score != "class" else scores[layer], boxes[images],
                                 tuple(layout.grid_size), layout.patch_size)
            rows.append(row(model=name, layer=layer, layer_kind=kind, group=score, metric="pib", value=found.pib,
                            n=found.images) | {"units": image_hits(scores[layer] if score == "class" else
                                                                   scores[layer][images], boxes[images], images,
                                                                   tuple(layout.grid_size), layout.patch_size)})
            rows.append(row(model=name, layer=layer, layer_kind=kind, group=score, metric="pib_ties",
                            value=float(found.ties), n=found.images))
            if name == label:
                rows.append(row(model=CHANCE, layer=layer, layer_kind=kind, group=score, metric="pib",
                                value=found.chance, n=found.images))
    return ProbeResult("pib", rows, {"model": label, "layers": wanted, "score": score, "norm": norm,
                                     "images": len(dataset), "scored_images": len(images), "seed": seed,
                                     "input_side": side})


def image_hits(scores: Tensor, boxes: Tensor, images: Tensor, grid: tuple[int, int], size: float
               ) -> dict[str, list]:
    """Per-image PiB hits in percent (100 or 0, a tie counts 0) as ``units`` (``vitscope.metrics.units.per_image``'s
    form: one unit per image), so that two layers' PiB can be compared image by image, in PiB's own unit."""
    hits = torch.tensor([point_in_box(scores[i: i + 1], boxes[i: i + 1], grid, size).pib
                         for i in range(len(scores))], dtype=torch.float64)
    return per_image(hits, images)


def class_evidence(model: nn.Module, dataset: ImageDataset, layers: Sequence[int], fit: Tensor, held: Tensor, *,
                   norm: bool, seed: int, device: torch.device | str, options: dict[str, Any]) -> dict[int, Tensor]:
    """Per token layer, the class-evidence map (``held`` images, patches): each held-out patch token's logit of
    its image's class under a linear classifier fitted on single patch tokens of the ``fit`` images (module
    docstring)."""
    features = extract_features(model, dataset, list(layers), norm=norm, **options)
    labels = dataset.labels.long()
    classes = int(labels.max()) + 1
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for layer in layers:
        patches = features[layer].patches
        per_image = patches.shape[1]
        count = min(CLASS_TOKENS, len(fit) * per_image)
        flat = torch.randperm(len(fit) * per_image, generator=generator)[:count]
        rows, cols = fit[flat // per_image], flat % per_image
        classifier = fit_classifier(patches[rows, cols].float(), labels[rows], classes, seed=seed, device=device,
                                    groups=rows)
        logits = classifier.logits(patches[held].float().flatten(0, 1)).cpu().unflatten(0, (len(held), per_image))
        out[layer] = logits.gather(2, labels[held][:, None, None].expand(-1, per_image, 1))[..., 0]
    return out
