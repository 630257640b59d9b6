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

from vitscope.attention import masked_logits, native
from vitscope.compiled import compiled
from vitscope.metrics import UNITS
from vitscope.metrics.locality import locality_from_row_sums, locality_row_sums, unit_scale
from vitscope.metrics.norms import token_norms
from vitscope.models import AttentionSite, TokenLayout, attention_sites
from vitscope.models.sites import token_blocks
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


def attention_logits(scaled_q: Tensor, k: Tensor) -> Tensor:
    """q k^T (B, heads, T, T) in float32 from scaled queries and keys (B, heads, T, head_dim)."""
    return scaled_q.float() @ k.float().transpose(-2, -1)


def softmax_row_sums(scaled_q: Tensor, k: Tensor, distances: Tensor, *, prefix: int
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """``locality_row_sums`` of softmax(q k^T) restricted to patches, without keeping the probabilities."""
    probs = attention_logits(scaled_q, k).softmax(dim=-1)
    return locality_row_sums(probs[..., prefix:, prefix:], distances)


class _StatsAccumulator:
    """Running sums for one layer's MAD and entropy per head (definitions in vitscope.metrics.locality)."""

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.mad_sum = self.mad_count = self.ent_sum = self.ent_count = None
        self.images = 0
        self._geometries: dict[tuple, tuple[TokenLayout, Tensor, float]] = {}

    def _geometry(self, layout: TokenLayout, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, float]:
        """The layout's distance matrix on ``device`` and its unit scale, computed once per layout."""
        key = (id(layout), device, dtype)
        if key not in self._geometries:  # the layout is kept in the value, so its id cannot be reused
            dist = layout.distance_matrix().to(device, dtype)
            self._geometries[key] = (layout, dist, unit_scale(dist, self.options["unit"], layout.patch_size))
        return self._geometries[key][1:]

    def update(self, probs: Tensor, layout: TokenLayout) -> None:
        """Add one batch of probabilities (B, heads, Tq, Tk)."""
        with torch.no_grad():
            prefix = layout.num_prefix_tokens
            block = probs.detach()[..., prefix:, prefix:]
            block = block if block.dtype == torch.float64 else block.float()
            dist, scale = self._geometry(layout, block.device, block.dtype)
            if tuple(dist.shape) != tuple(block.shape[-2:]):
                raise ValueError(f"attention patch block {tuple(block.shape[-2:])} does not match the layout's "
                                 f"distances {tuple(dist.shape)}; check num_prefix_tokens and grid_size")
            self._add(compiled(locality_row_sums)(block, dist), block.shape[-1], scale)

    def update_softmax(self, scaled_q: Tensor, k: Tensor, attn_mask: Tensor | None, layout: TokenLayout) -> None:
        """Add one batch given the scaled queries and keys (B, heads, T, head_dim) of a softmax attention."""
        if attn_mask is not None:  # rare: the plain path
            self.update(masked_logits(scaled_q, k, attn_mask).softmax(dim=-1), layout)
            return
        with torch.no_grad():
            prefix = layout.num_prefix_tokens
            dist, scale = self._geometry(layout, k.device, torch.float32)
            if native.runs_on(k):  # the row sums straight from the logits, no probabilities
                sums = native.softmax_locality(attention_logits(scaled_q.detach(), k.detach()), dist, prefix)
            else:
                sums = compiled(softmax_row_sums, prefix=prefix)(scaled_q.detach(), k.detach(), dist)
            self._add(sums, k.shape[-2] - prefix, scale)

    def _add(self, sums: tuple[Tensor, Tensor, Tensor], num_keys: int, scale: float) -> None:
        mad, ent = locality_from_row_sums(*sums, num_keys=num_keys, scale=scale,
                                          renormalize=self.options["renormalize"])
        mad, ent = mad.double(), ent.double()
        if self.mad_sum is None:
            zeros = torch.zeros(mad.shape[1], dtype=torch.float64, device=mad.device)
            self.mad_sum, self.mad_count, self.ent_sum, self.ent_count = (zeros.clone() for _ in range(4))
        self.mad_sum += torch.nan_to_num(mad, nan=0.0).sum(0)
        self.mad_count += (~mad.isnan()).sum(0)
        self.ent_sum += torch.nan_to_num(ent, nan=0.0).sum(0)
        self.ent_count += (~ent.isnan()).sum(0)
        self.images += mad.shape[0]


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

    def _softmax_observer(self, slot: int):
        def observe(scaled_q: Tensor, k: Tensor, attn_mask: Tensor | None, layout: TokenLayout) -> None:
            self.layouts[slot] = layout
            self._acc[slot].update_softmax(scaled_q, k, attn_mask, layout)

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


def _chosen(layers: Sequence[int] | int | None, count: int) -> list[int]:
    """0-based indices from one index, several, or None for all (a range error names the valid ones)."""
    return resolve_block_indices([layers] if isinstance(layers, int) else layers, count)


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
    sites = [all_sites[i] for i in _chosen(layers, len(all_sites))]
    recording = AttentionRecording(sites, keep, {"renormalize": renormalize, "unit": unit})
    detachers = []
    try:
        for slot, site in enumerate(sites):
            if keep == "stats":
                detachers.append(site.attach_streaming(recording._observer(slot), recording._softmax_observer(slot)))
            else:
                detachers.append(site.attach(recording._observer(slot)))
        yield recording
    finally:
        for detach in reversed(detachers):
            detach()


class TokenRecording:
    """What ``record_tokens`` yields. Per recorded block, over every batch seen: ``tokens`` (B, T, D) output
    tokens before the final norm, ``normed`` the same after the model's final norm (plain ViTs; None for
    hierarchical models), or with ``keep="norms"`` only ``norms`` (B, T) and ``normed_norms``."""

    def __init__(self, names: list[str], keep: str, final_norm: nn.Module | None):
        self.names, self.keep, self.final_norm = names, keep, final_norm
        self._raw: list[list[Tensor]] = [[] for _ in names]
        self._normed: list[list[Tensor]] = [[] for _ in names]

    def _add(self, slot: int, output: Tensor) -> None:
        with torch.no_grad():
            tokens = output.detach()
            tokens = tokens.flatten(1, -2) if tokens.ndim > 3 else tokens  # Swin: (B, H, W, C) -> (B, HW, C)
            normed = self.final_norm(tokens) if self.final_norm is not None else None
            if self.keep == "norms":
                tokens = token_norms(tokens)
                normed = token_norms(normed) if normed is not None else None
            self._raw[slot].append(tokens)
            if normed is not None:
                self._normed[slot].append(normed)

    def _gather(self, chunks: list[list[Tensor]]) -> list[Tensor | None]:
        return [torch.cat(c) if c else None for c in chunks]

    @property
    def tokens(self) -> list[Tensor]:
        if self.keep != "tokens":
            raise ValueError("tokens were not kept; record with keep='tokens'")
        return self._gather(self._raw)

    @property
    def normed(self) -> list[Tensor | None]:
        if self.keep != "tokens":
            raise ValueError("tokens were not kept; record with keep='tokens'")
        return self._gather(self._normed)

    @property
    def norms(self) -> list[Tensor]:
        return self._gather(self._raw) if self.keep == "norms" else [token_norms(t) for t in self.tokens]

    @property
    def normed_norms(self) -> list[Tensor | None]:
        if self.keep == "norms":
            return self._gather(self._normed)
        return [token_norms(t) if t is not None else None for t in self.normed]


@contextmanager
def record_tokens(model: nn.Module, layers: Sequence[int] | int | None = None, keep: str = "tokens"
                  ) -> Iterator[TokenRecording]:
    """Record each chosen block's output tokens (0-based block indices; None = all) while the block runs.

    ``keep="norms"`` stores only token norms (B, T), a thousand times less memory than the tokens. The
    model is left exactly as it was on exit, also after an error."""
    if keep not in ("tokens", "norms"):
        raise ValueError(f"keep={keep!r} is unknown; use 'tokens' or 'norms'")
    blocks = token_blocks(model)
    chosen = _chosen(layers, len(blocks))
    plain = hasattr(model, "num_prefix_tokens")
    recording = TokenRecording([blocks[i][0] for i in chosen], keep, getattr(model, "norm", None) if plain else None)
    handles = []
    try:
        for slot, i in enumerate(chosen):
            handles.append(blocks[i][1].register_forward_hook(
                lambda _m, _inputs, output, slot=slot: recording._add(slot, output)))
        yield recording
    finally:
        for handle in handles:
            handle.remove()
