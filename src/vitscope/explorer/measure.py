"""Run one model on the explored images and keep what the page shows: attention maps, per-head MAD and entropy,
token norms and the high-norm threshold.

Everything is measured on the full-precision maps with the project's functions: per image,
``vitscope.metrics.mean_attention_distance`` and ``attention_entropy`` (normalised units, renormalised rows); over
the set, the streamed per-head means of those values (``vitscope.metrics.PerHeadMeans``: mean over images, NaN
entries skipped and counted), as ``LocalityAccumulator`` keeps them.
Norms are ``vitscope.record_tokens``' block outputs before the final norm, and the high-norm threshold follows the
rule of ``vitscope analyze norms`` (``vitscope.metrics.norms.high_norm_threshold`` on the detection block's patch
tokens of these images), fixed there and applied to every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.explorer.geometry import layer_geometry
from vitscope.metrics import PerHeadMeans, attention_entropy, mean_attention_distance
from vitscope.metrics.norms import Threshold, high_norm_threshold
from vitscope.models import attention_sites
from vitscope.record import record_attention, record_tokens


@dataclass
class LayerRecord:
    """One recorded attention layer (``index`` 0-based): maps (images, kept heads, rows, keys) float32 on the CPU,
    per-image MAD and entropy (images, heads), set means (heads,), token norms (images, tokens) of its block's
    output, and its geometry (JSON part, index arrays)."""

    index: int
    heads: list[int]
    num_heads: int
    maps: Tensor
    mad_image: Tensor
    entropy_image: Tensor
    mad_set: Tensor
    entropy_set: Tensor
    skipped: Tensor
    norms: Tensor
    geometry: dict[str, Any]
    arrays: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ModelRecord:
    label: str
    depth: int
    layers: list[LayerRecord]
    threshold: Threshold
    detect_layer: int  # 0-based block index
    high_norm_fraction: float


def matched_layers(reference: Sequence[int], reference_depth: int, depth: int) -> list[int]:
    """Layers (0-based) of a ``depth``-layer model at the same relative depth as ``reference`` layers of a
    ``reference_depth``-layer one: layer l (1-based) matches round(l * depth / reference_depth)."""
    return [min(depth, max(1, round((i + 1) * depth / reference_depth))) - 1 for i in reference]


@torch.no_grad()
def record_model(model: nn.Module, inputs: Tensor, label: str, *, layers: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, threshold: str = "percentile:98", detect_layer: int = -1,
                 batch_size: int = 16, device: torch.device | str = "cpu") -> ModelRecord:
    """Record ``model`` on normalised ``inputs`` (images, 3, S, S). ``layers`` and ``heads`` are 0-based (None:
    all); ``detect_layer`` is the 0-based block whose patch-token norms set the threshold (-1: the last)."""
    model = model.to(device).eval()
    sites = attention_sites(model)
    depth = len(sites)
    chosen = list(range(depth)) if layers is None else sorted({int(i) % depth for i in layers})
    means = PerHeadMeans()
    maps: dict[int, list[Tensor]] = {i: [] for i in chosen}
    per_image: dict[int, list[tuple[Tensor, Tensor]]] = {i: [] for i in chosen}
    norms_seen: list[list[Tensor]] = []
    layouts: dict[int, Any] = {}
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size].to(device)
        with record_attention(model, chosen, keep="maps") as rec, \
                record_tokens(model, keep="norms") as tokens:
            model(batch)
        for slot, index in enumerate(chosen):
            probs, layout = rec.maps[slot].float(), rec.layouts[slot]
            layouts[index] = layout
            options = {"num_prefix_tokens": layout.num_prefix_tokens}
            mad = mean_attention_distance(probs, distances=layout.distance_matrix().to(probs.device), **options)
            entropy = attention_entropy(probs, **options)
            means.add(index, {"mad": mad, "entropy": entropy})
            per_image[index].append((mad.cpu(), entropy.cpu()))
            kept = _kept_heads(heads, probs.shape[1])
            maps[index].append(probs[:, kept].cpu())
        norms_seen.append([n.cpu() for n in tokens.norms])
    norms = [torch.cat(per_block) for per_block in zip(*norms_seen, strict=True)]
    if len(norms) != depth:
        raise ValueError(f"{label}: {depth} attention layers but {len(norms)} token blocks; the explorer pairs block "
                         "l's attention with its output tokens, so the two must match")
    detect = detect_layer % len(norms)
    prefix = layouts[chosen[0]].num_prefix_tokens
    rule = high_norm_threshold(norms[detect][:, prefix:], threshold)
    records = []
    for index in chosen:
        layout = layouts[index]
        num_heads = int(means.mean("mad", index).shape[0])
        geometry, arrays = layer_geometry(model, sites[index], layout)
        records.append(LayerRecord(
            index=index, heads=_kept_heads(heads, num_heads), num_heads=num_heads, maps=torch.cat(maps[index]),
            mad_image=torch.cat([m for m, _ in per_image[index]]), entropy_image=torch.cat([e for _, e in
                                                                                           per_image[index]]),
            mad_set=means.mean("mad", index), entropy_set=means.mean("entropy", index),
            skipped=means.skipped("mad", index), norms=norms[index],
            geometry=geometry, arrays=arrays))
    fraction = float((norms[detect][:, prefix:] > rule.value).float().mean())
    return ModelRecord(label, depth, records, rule, detect, fraction)


def _kept_heads(heads: Sequence[int] | None, count: int) -> list[int]:
    """0-based heads kept of a layer with ``count`` heads (None: all; heads past ``count`` are left out)."""
    if heads is None:
        return list(range(count))
    kept = sorted({int(h) for h in heads if 0 <= int(h) < count})
    return kept or [0]
