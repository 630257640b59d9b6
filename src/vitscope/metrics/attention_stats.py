"""Per-layer, per-head attention statistics over a dataset: the result of streaming MAD and entropy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vitscope.metrics.layers import early_layers


@dataclass
class AttentionStats:
    """Per-layer, per-head means over every (image, head) with patch mass.

    ``mad`` and ``entropy`` are (layers, heads); ``images`` counts the images seen per layer and
    ``skipped`` (layers, heads) the (image, head) entries left out because no query row had patch mass.
    ``layers`` holds the 0-based indices of the recorded layers; ``options`` the metric options used.
    ``mad_raw`` (layers, heads), when kept, is the MAD of the raw patch mass whatever ``options`` say
    (``renormalize=False``: each row's mass on prefix tokens counted at distance 0, rows not renormalised).
    Models whose layers differ in head count (Swin, PVT) are padded with NaN; ``heads`` has the counts.
    """

    layers: list[int]
    mad: Tensor
    entropy: Tensor
    images: Tensor
    skipped: Tensor
    options: dict[str, Any] = field(default_factory=dict)
    heads: list[int] = field(default_factory=list)
    mad_raw: Tensor | None = None

    @classmethod
    def stack(cls, layers: list[int], *, mad: list[Tensor], entropy: list[Tensor], images: list[int],
              skipped: list[Tensor], options: dict[str, Any], mad_raw: list[Tensor] | None = None) -> AttentionStats:
        """From per-layer (heads,) vectors of possibly different lengths, padded to the widest."""
        width = max(len(v) for v in mad)

        def padded(values: list[Tensor], fill: float) -> Tensor:
            return torch.stack([torch.cat([v, v.new_full((width - len(v),), fill)]) for v in values])

        return cls(layers=list(layers), mad=padded(mad, torch.nan), entropy=padded(entropy, torch.nan),
                   images=torch.tensor(images), skipped=padded(skipped, 0), options=options,
                   heads=[len(v) for v in mad], mad_raw=None if mad_raw is None else padded(mad_raw, torch.nan))

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
        picks = [self.layers.index(layer) for layer in early_layers(self.layers, layers)]
        return float(torch.nan_to_num(self.mad[picks], nan=float("inf")).min())
