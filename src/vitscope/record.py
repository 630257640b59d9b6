"""Record attention from a model while it runs: whole maps, or streaming per-head statistics.

    with vitscope.record_attention(model, keep="stats") as rec:
        for images, _ in loader:
            model(images)
    rec.stats.mad       # (layers, heads) mean attention distance over every image seen

Layers are 0-based Python indices into the model's attention sites (block order).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.metrics import UNITS, attention_entropy, mean_attention_distance
from vitscope.models import AttentionSite, TokenLayout, attention_sites
from vitscope.models.vit import resolve_block_indices


@dataclass
class AttentionStats:
    """Per-layer, per-head means over every (image, head) with patch mass.

    ``mad`` and ``entropy`` are (layers, heads); ``images`` counts the images seen per layer and
    ``skipped`` (layers, heads) the (image, head) entries left out because no query row had patch mass.
    ``layers`` holds the 0-based indices of the recorded layers; ``options`` the metric options used.
    Models whose layers differ in head count (Swin, PVT) are padded with NaN; ``heads`` has the counts.
    """

    layers: list[int]
    mad: Tensor
    entropy: Tensor
    images: Tensor
    skipped: Tensor
    options: dict[str, Any] = field(default_factory=dict)
    heads: list[int] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per (layer, head), both numbered from 1 as in files and reports."""
        out = []
        for li, layer in enumerate(self.layers):
            for head in range(self.heads[li] if self.heads else self.mad.shape[1]):
                out.append({
                    "layer": layer + 1,
                    "head": head + 1,
                    "mad": float(self.mad[li, head]),
                    "entropy": float(self.entropy[li, head]),
                    "images": int(self.images[li]),
                    "skipped": int(self.skipped[li, head]),
                })
        return out

    def min_early_mad(self, layers: Sequence[int] | None = None) -> float:
        """Smallest head MAD within ``layers`` (0-based); default: the first quarter of the recorded layers."""
        if layers is None:
            layers = self.layers[: max(1, len(self.layers) // 4)]
        picks = [self.layers.index(layer) for layer in layers]
        return float(torch.nan_to_num(self.mad[picks], nan=float("inf")).min())


class _StatsAccumulator:
    """Running sums for one layer's MAD and entropy per head."""

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.mad_sum = self.mad_count = self.ent_sum = self.ent_count = None
        self.images = 0

    def update(self, probs: Tensor, layout: TokenLayout) -> None:
        with torch.no_grad():
            probs = probs.detach()
            mad = mean_attention_distance(
                probs,
                None if layout.distances is not None else layout.grid_size,
                num_prefix_tokens=layout.num_prefix_tokens,
                distances=layout.distances,
                patch_size=layout.patch_size,
                **self.options,
            ).double()
            ent = attention_entropy(probs, num_prefix_tokens=layout.num_prefix_tokens).double()
        if self.mad_sum is None:
            zeros = torch.zeros(mad.shape[1], dtype=torch.float64, device=mad.device)
            self.mad_sum, self.mad_count, self.ent_sum, self.ent_count = (zeros.clone() for _ in range(4))
        self.mad_sum += torch.nan_to_num(mad, nan=0.0).sum(0)
        self.mad_count += (~mad.isnan()).sum(0)
        self.ent_sum += torch.nan_to_num(ent, nan=0.0).sum(0)
        self.ent_count += (~ent.isnan()).sum(0)
        self.images += probs.shape[0]


class AttentionRecording:
    """What ``record_attention`` yields: ``maps`` or ``stats``, filled as the model runs."""

    def __init__(self, sites: list[AttentionSite], keep: str, options: dict[str, Any]):
        self.sites = sites
        self.keep = keep
        self.options = options
        self._maps: list[list[Tensor]] = [[] for _ in sites]
        self._acc = [_StatsAccumulator(options) for _ in sites]
        self.layouts: list[TokenLayout | None] = [None for _ in sites]

    def _observer(self, slot: int):
        def observe(probs: Tensor, layout: TokenLayout) -> None:
            self.layouts[slot] = layout
            if self.keep == "maps":
                self._maps[slot].append(probs.detach())
            else:
                self._acc[slot].update(probs, layout)

        return observe

    @property
    def maps(self) -> list[Tensor]:
        """Per recorded layer in block order, the probabilities (B, heads, Tq, Tk) of every batch seen."""
        if self.keep != "maps":
            raise ValueError("maps were not kept; record with keep='maps'")
        return [torch.cat(chunks) if len(chunks) > 1 else (chunks[0] if chunks else None) for chunks in self._maps]

    @property
    def stats(self) -> AttentionStats:
        if self.keep != "stats":
            raise ValueError("statistics were not kept; record with keep='stats'")
        if any(acc.mad_sum is None for acc in self._acc):
            raise ValueError("no forward pass was recorded; run the model inside the 'with' block")

        width = max(len(a.mad_sum) for a in self._acc)

        def padded(values: list[Tensor], fill: float) -> Tensor:
            return torch.stack([torch.cat([v, v.new_full((width - len(v),), fill)]) for v in values])

        def mean(total: Tensor, count: Tensor) -> Tensor:
            return torch.where(count > 0, total / count.clamp(min=1), torch.nan).float().cpu()

        return AttentionStats(
            layers=[site.index for site in self.sites],
            mad=padded([mean(a.mad_sum, a.mad_count) for a in self._acc], torch.nan),
            entropy=padded([mean(a.ent_sum, a.ent_count) for a in self._acc], torch.nan),
            images=torch.tensor([a.images for a in self._acc]),
            skipped=padded([(a.images - a.mad_count).long().cpu() for a in self._acc], 0),
            options=dict(self.options),
            heads=[len(a.mad_sum) for a in self._acc],
        )


@contextmanager
def record_attention(
    model: nn.Module,
    layers: Sequence[int] | int | None = None,
    keep: str = "maps",
    *,
    renormalize: bool = True,
    unit: str = "normalized",
) -> Iterator[AttentionRecording]:
    """Observe attention probabilities of ``layers`` (0-based index or indices; None = all) while the block runs.

    ``keep="maps"`` stores every map; ``keep="stats"`` keeps only running per-head MAD and entropy
    (``renormalize`` and ``unit`` as in ``vitscope.metrics.mean_attention_distance``), so memory does not
    grow with the data. On exit, also after an error, the model is left exactly as it was.
    """
    if keep not in ("maps", "stats"):
        raise ValueError(f"keep={keep!r} is unknown; use 'maps' or 'stats'")
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is unknown; use one of {', '.join(UNITS)}")
    all_sites = attention_sites(model)
    if isinstance(layers, int):
        layers = [layers]
    chosen = resolve_block_indices(layers, len(all_sites))
    sites = [all_sites[i] for i in chosen]
    recording = AttentionRecording(sites, keep, {"renormalize": renormalize, "unit": unit})
    detachers = []
    try:
        for slot, site in enumerate(sites):
            detachers.append(site.attach(recording._observer(slot)))
        yield recording
    finally:
        for detach in reversed(detachers):
            detach()
