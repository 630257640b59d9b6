"""Point-in-Box per layer (definition in ``vitscope.metrics.pib``) with its chance level beside it.

Scores: ``attention`` — CLS-to-patch attention averaged over heads, at attention layer l (inside block l, whose
queries are token layer l - 1), recorded with ``vitscope.record_attention``; ``norm`` — the L2 norm of each patch
token at token layer l before the final norm; ``cosine`` — cosine similarity of each patch token to the CLS token
at token layer l (after the final norm unless ``norm=False``). Boxes come from ``dataset.extras["boxes"]`` in the
dataset's pixels and are scaled to the model's input side.
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
from vitscope.models import token_layout
from vitscope.probes.baselines import random_twin
from vitscope.probes.features import depth_of, extract_features, parse_layers
from vitscope.probes.results import CHANCE, RANDOM_SUFFIX, ProbeResult, row
from vitscope.record import record_attention

SCORES = ("attention", "norm", "cosine")


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
    for name, backbone in models:
        if score == "attention":
            scores = attention_scores(backbone, dataset, wanted, batch_size=batch_size, device=device,
                                      img_size=img_size)
        else:
            scores = _token_scores(backbone, dataset, wanted, score, norm, {
                "batch_size": batch_size, "device": device, "img_size": img_size, "cache": cache,
                "progress": progress})
        for layer in wanted:
            found = point_in_box(scores[layer], boxes, tuple(layout.grid_size), layout.patch_size)
            rows.append(row(model=name, layer=layer, layer_kind=kind, group=score, metric="pib", value=found.pib,
                            n=found.images))
            rows.append(row(model=name, layer=layer, layer_kind=kind, group=score, metric="pib_ties",
                            value=float(found.ties), n=found.images))
            if name == label:
                rows.append(row(model=CHANCE, layer=layer, layer_kind=kind, group=score, metric="pib",
                                value=found.chance, n=found.images))
    return ProbeResult("pib", rows, {"model": label, "layers": wanted, "score": score, "norm": norm,
                                     "images": len(dataset), "seed": seed, "input_side": side})
