"""What attends to high-norm tokens, streamed in the census's one pass over the data: per attention layer and image,
the mean probability row of the CLS query and of the patch queries (averaged over heads), from which the mass on
any set of keys follows afterwards, once the threshold is known.

The mass a query puts on a key set is linear in its probability row, so ``vitscope.metrics.high_norm``'s
``mass_on_high_norm`` (the mass per head and query, then averaged) equals the averaged row dotted with the key set.
No map is kept: each layer's probabilities are formed image by image from its queries and keys (softmax), or
batch by batch for other normalisers, and reduced to two rows of length T before the next layer runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vitscope.metrics import AttentionBatch
from vitscope.metrics.high_norm import high_norm_mask
from vitscope.metrics.norms import Threshold
from vitscope.probes.results import row


class AttentionRows:
    """A streamed metric (``record_attention(..., accumulators=[...])``) over the first ``count`` images: per layer,
    ``cls`` and ``patch`` (images, T), the CLS query's probability row and the patch queries' mean row, each
    averaged over heads (``prefix`` prefix tokens, CLS first; ``cls`` stays empty without one)."""

    def __init__(self, count: int, prefix: int):
        self.count, self.prefix = count, prefix
        self.cls: dict[int, list[Tensor]] = {}
        self.patch: dict[int, list[Tensor]] = {}

    def _seen(self, layer: int) -> int:
        return sum(len(part) for part in self.patch.get(layer, []))

    def update(self, layer: int, batch: AttentionBatch) -> None:
        take = self.count - self._seen(layer)
        if take <= 0:
            return
        with torch.no_grad():
            if batch.softmax_qk is not None:  # one image's maps at a time
                qk = batch.softmax_qk
                rows = [self._rows(((qk.q[i].float() * qk.scale) @ qk.k[i].float().transpose(-2, -1)).softmax(-1)[None])
                        for i in range(min(take, len(qk.q)))]
                cls, patch = (torch.cat(parts) for parts in zip(*rows, strict=True))
            else:
                cls, patch = self._rows(batch.probs()[:take].float())
        self.cls.setdefault(layer, []).append(cls.cpu())
        self.patch.setdefault(layer, []).append(patch.cpu())

    def _rows(self, probs: Tensor) -> tuple[Tensor, Tensor]:
        """(CLS row, patch queries' mean row), each (B, T), of probabilities (B, heads, T, T)."""
        cls = probs[:, :, 0].mean(dim=1) if self.prefix else probs.new_zeros(len(probs), 0)
        return cls, probs[:, :, self.prefix:].mean(dim=(1, 2))

    def layers(self) -> list[int]:
        return sorted(self.patch)

    def rows_of(self, layer: int) -> tuple[Tensor | None, Tensor]:
        """(cls (images, T) or None without a CLS token, patch (images, T)) of ``layer`` (0-based block index)."""
        cls = torch.cat(self.cls[layer]) if self.prefix else None
        return cls, torch.cat(self.patch[layer])


def mass_rows(rows: AttentionRows, label: str, norms: list[Tensor], threshold: Threshold,
              extra: dict[str, Any]) -> tuple[list[dict[str, Any]], Tensor]:
    """Attention mass on high-norm keys per attention layer (the census's rows), and the CLS rows (images, T) of the
    last layer (the patch queries' mean row without a CLS token). Attention layer l reads token layer l - 1, whose
    norms are ``norms[l - 1]`` (token layer 0 is the embedding)."""
    out = []
    prefix = rows.prefix
    for index in rows.layers():
        cls, patch = rows.rows_of(index)
        count = len(patch)
        high = high_norm_mask(norms[index][:count], threshold.value, prefix)
        keys = torch.cat([high.new_zeros(count, prefix), high], dim=1).float()
        layer = index + 1
        masses = {"patch": (patch * keys).sum(-1)} | ({"cls": (cls * keys).sum(-1)} if cls is not None else {})
        for group in ("cls", "patch"):
            if group in masses:
                out.append(row(model=label, layer=layer, layer_kind="attention", group=f"{group}-query",
                               metric="attention_mass_on_high_norm", value=float(masses[group].mean()), n=count)
                           | extra)
        out.append(row(model=label, layer=layer, layer_kind="attention", group="high-norm", metric="key_share",
                       value=float((keys.sum(dim=1) / keys.shape[1]).mean()), n=count) | extra)
    cls, patch = rows.rows_of(rows.layers()[-1])
    return out, cls if cls is not None else patch
