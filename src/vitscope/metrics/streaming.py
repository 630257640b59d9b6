"""Streaming attention statistics: accumulators that see one layer's attention one batch at a time.

The recorder (``vitscope.record_attention``) captures attention and hands each layer's batch to every
accumulator as an ``AttentionBatch``: the geometry as plain tensors (patch distances, prefix count) and the
probabilities, computed on first use, or, for an unmasked softmax, its queries, keys and scale
(``SoftmaxInputs``) so that a metric can skip the probabilities. A new streamed metric is a new accumulator
here (or in the caller's code), handed to ``record_attention(..., accumulators=[...])``; the recorder does not
change.

An accumulator implements ``update(layer, batch)`` (``layer``: the 0-based block index). ``PerHeadMeans``
keeps running per-layer, per-head means of per-(image, head) values, skipping and counting NaN entries;
``LocalityAccumulator`` (MAD and entropy) and ``SupportAccumulator`` (exact zeros, support size) use it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch
from torch import Tensor

from vitscope.attention import native
from vitscope.attention.paths import current
from vitscope.compiled import compiled
from vitscope.metrics.attention_stats import AttentionStats
from vitscope.metrics.locality import (
    UNITS,
    locality_from_map_sums,
    patch_map_sums,
    softmax_map_sums,
    unit_scale,
)


@dataclass(frozen=True)
class SoftmaxInputs:
    """What an unmasked softmax attention's probabilities come from: softmax(``scale`` q k^T), with queries ``q``
    (B, heads, Tq, head_dim) and keys ``k`` (B, heads, Tk, head_dim), after any q/k norm."""

    q: Tensor
    k: Tensor
    scale: float

    @property
    def scaled_q(self) -> Tensor:
        return self.q * self.scale


@dataclass
class AttentionBatch:
    """One layer's attention on one batch, as an accumulator sees it.

    ``prefix``: prefix tokens (CLS, registers) before the patches, in queries and keys. ``distances``
    (Nq, Nk): patch-query x patch-key distances in patch units, float32 on the attention's device.
    ``patch_size``: pixels per distance unit. ``geometry``: a key equal for batches with equal distances
    (for caching). ``softmax_qk``: the ``SoftmaxInputs`` when the layer is an unmasked softmax attention whose
    canonical probabilities are its raw ones, else None. ``probs()``: the probabilities (B, heads, Tq, Tk),
    computed once.
    """

    prefix: int
    distances: Tensor
    patch_size: int
    geometry: Hashable
    load_probs: Callable[[], Tensor]
    softmax_qk: SoftmaxInputs | None = None
    _probs: Tensor | None = field(default=None, repr=False)

    def probs(self) -> Tensor:
        if self._probs is None:
            self._probs = self.load_probs().detach()
        return self._probs

    def patch_probs(self) -> Tensor:
        """Probabilities restricted to patch queries and patch keys (B, heads, Nq, Nk), float32 or float64,
        checked against the distances."""
        block = self.probs()[..., self.prefix:, self.prefix:]
        block = block if block.dtype == torch.float64 else block.float()
        if tuple(self.distances.shape) != tuple(block.shape[-2:]):
            raise ValueError(f"attention patch block {tuple(block.shape[-2:])} does not match the layout's "
                             f"distances {tuple(self.distances.shape)}; check num_prefix_tokens and grid_size")
        return block


class StreamingMetric(Protocol):
    """What ``record_attention`` hands batches to."""

    def update(self, layer: int, batch: AttentionBatch) -> None: ...


class PerHeadMeans:
    """Running means per layer and head of per-(image, head) values (B, heads), one set per name.

    NaN entries are skipped and counted (``skipped``); ``images`` counts the images seen per layer."""

    def __init__(self) -> None:
        self.sums: dict[str, dict[int, Tensor]] = {}
        self.counts: dict[str, dict[int, Tensor]] = {}
        self.images: dict[int, int] = {}

    def add(self, layer: int, values: dict[str, Tensor]) -> None:
        batch = 0
        for name, value in values.items():
            value = value.detach().double()
            batch = value.shape[0]
            sums, counts = self.sums.setdefault(name, {}), self.counts.setdefault(name, {})
            if layer not in sums:
                sums[layer] = torch.zeros(value.shape[1], dtype=torch.float64, device=value.device)
                counts[layer] = torch.zeros_like(sums[layer])
            sums[layer] += torch.nan_to_num(value, nan=0.0).sum(0)
            counts[layer] += (~value.isnan()).sum(0)
        self.images[layer] = self.images.get(layer, 0) + batch

    @property
    def layers(self) -> list[int]:
        return sorted(self.images)

    def mean(self, name: str, layer: int) -> Tensor:
        """(heads,) float32 on the CPU; NaN for a head without any counted entry."""
        total, count = self.sums[name][layer], self.counts[name][layer]
        return torch.where(count > 0, total / count.clamp(min=1), torch.nan).float().cpu()

    def skipped(self, name: str, layer: int) -> Tensor:
        """(heads,) entries left out because they were NaN."""
        return (self.images[layer] - self.counts[name][layer]).long().cpu()


class LocalityAccumulator:
    """Per-head mean attention distance and normalised entropy (definitions in ``vitscope.metrics.locality``),
    streamed; beside the MAD of ``renormalize``, the raw patch mass's (``mad_raw``: prefix keys counted at
    distance 0) from the same sums. An unmasked softmax layer is measured from its queries and keys without keeping
    probabilities (the native kernel on the CPU, a compiled one elsewhere, each only where ``fast_paths`` allows
    it)."""

    def __init__(self, renormalize: bool = True, unit: str = "normalized"):
        if unit not in UNITS:
            raise ValueError(f"unit={unit!r} is unknown; use one of {', '.join(UNITS)}")
        self.options = {"renormalize": renormalize, "unit": unit}
        self.means = PerHeadMeans()
        self._scales: dict[Hashable, float] = {}

    def _scale(self, batch: AttentionBatch) -> float:
        if batch.geometry not in self._scales:
            self._scales[batch.geometry] = unit_scale(batch.distances, self.options["unit"], batch.patch_size)
        return self._scales[batch.geometry]

    def update(self, layer: int, batch: AttentionBatch) -> None:
        with torch.no_grad():
            if batch.softmax_qk is not None:
                sums = _softmax_sums(batch.softmax_qk, batch.distances, batch.prefix)
                num_keys = batch.softmax_qk.k.shape[-2] - batch.prefix
            else:
                block = batch.patch_probs()
                sums = fastest(patch_map_sums)(block, batch.distances.to(block.dtype))
                num_keys = block.shape[-1]
            mad, ent = locality_from_map_sums(sums, num_keys=num_keys, scale=self._scale(batch),
                                              renormalize=self.options["renormalize"])
            raw = sums[..., 2] / sums[..., 0] * self._scale(batch)  # renormalize=False: prefix keys at distance 0
            self.means.add(layer, {"mad": mad, "entropy": ent, "mad_raw": raw})

    def stats(self, layers: list[int]) -> AttentionStats:
        """The statistics of ``layers`` (0-based, in recording order), padded with NaN to the widest layer."""
        if any(layer not in self.means.images for layer in layers):
            raise ValueError("no forward pass was recorded; run the model inside the 'with' block")
        m = self.means
        return AttentionStats.stack(layers, mad=[m.mean("mad", i) for i in layers],
                                    entropy=[m.mean("entropy", i) for i in layers],
                                    mad_raw=[m.mean("mad_raw", i) for i in layers],
                                    images=[m.images[i] for i in layers],
                                    skipped=[m.skipped("mad", i) for i in layers], options=dict(self.options))


class SupportAccumulator:
    """Per head, over patch queries and keys: the fraction of exact zeros and the mean support size (keys
    with nonzero probability per query row), each averaged over rows and then over images.

    Measures sparse normalisers (sparsemax, entmax); a softmax gives 0 and the number of keys."""

    def __init__(self) -> None:
        self.means = PerHeadMeans()

    def update(self, layer: int, batch: AttentionBatch) -> None:
        with torch.no_grad():
            nonzero = (batch.patch_probs() != 0).float()  # (B, heads, Nq, Nk)
            support = nonzero.sum(-1).mean(-1)
            self.means.add(layer, {"support": support, "zeros": 1 - support / nonzero.shape[-1]})

    def support(self, layer: int) -> Tensor:
        return self.means.mean("support", layer)

    def zeros(self, layer: int) -> Tensor:
        return self.means.mean("zeros", layer)


# Calls of a streamed metric's kernel on CPU tensors answered eagerly before it is compiled. Measured on the README's
# snippet (vit-compact, entmax-1.5, 4 batches of 64, 8 layers: 8 calls a batch; Dec 2, 2 shared cores at load 13-14):
# compiled, the first batch took 23-43 s (inductor's C++ compile, warm or cold disk cache) against 9-10 s eagerly,
# and later batches about 8.0 s against 9.7 s, so the compile pays back after 10-24 batches (80-190 calls).
CPU_EAGER_CALLS = 256


def fastest(fn: Callable, **constants) -> Callable:
    """``fn`` with ``constants`` bound: its compiled kernel where the fast paths in force allow compiled kernels
    (on the CPU only after ``CPU_EAGER_CALLS`` eager calls, when a job is long enough to earn the compile back),
    else the function itself."""
    if not current().compiled:
        return partial(fn, **constants)
    return compiled(fn, cpu_eager_calls=CPU_EAGER_CALLS, **constants)


def _softmax_sums(inputs: SoftmaxInputs, distances: Tensor, prefix: int) -> Tensor:
    """Map sums of softmax(scale q k^T) restricted to patches: the native kernel where it runs (reading q and k in
    place, forming no logits), else the compiled or eager twin."""
    q, k = inputs.q.detach(), inputs.k.detach()
    if native.runs_on(k):
        return native.softmax_locality(q, k, inputs.scale, distances, prefix)
    return fastest(softmax_map_sums, prefix=prefix)(q * inputs.scale, k, distances)
