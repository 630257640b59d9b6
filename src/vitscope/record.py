"""Record attention and tokens from a model while it runs. Recording captures; metrics measure.

    with vitscope.record_attention(model, keep="stats") as rec:
        for images, _ in loader:
            model(images)
    rec.stats.mad       # (layers, heads) mean attention distance over every image seen

``keep="maps"`` keeps every probability map; ``keep="stats"`` streams them into a
``vitscope.metrics.LocalityAccumulator`` (MAD and entropy) and keeps nothing else. Further streamed metrics
are accumulators from ``vitscope.metrics`` (or your own object with ``update(layer, batch)``) handed over
as ``accumulators=[...]``; each receives every recorded layer's ``AttentionBatch``. Recording leaves the
model's outputs bit-identical (no module changes path; probabilities are recomputed from the captured
queries and keys, and only when something asks for them; an unmasked softmax's statistics are computed from
q and k directly, without forming the maps).

Layers are 0-based Python indices into the model's attention sites (block order).

A slow model (ViT-g at 518 px takes minutes an image on a laptop CPU) shows its progress block by block with
``block_progress``, an image bar that advances by a fraction of the batch as each block finishes:

    with block_progress(model, total=len(dataset), desc="stats") as progress:
        for images, _ in loader:
            model(images)
            progress.batch_done(len(images))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitscope.metrics import UNITS, AttentionBatch, AttentionStats, LocalityAccumulator, StreamingMetric
from vitscope.metrics.norms import token_norms
from vitscope.models import AttentionSite, TokenLayout, attention_sites
from vitscope.models.capture.sites import Capture, token_blocks
from vitscope.models.own.vit import resolve_block_indices


class AttentionRecording:
    """What ``record_attention`` yields: ``maps`` or ``stats`` (and the ``accumulators``), filled as the model
    runs; ``layouts`` holds each recorded layer's latest token layout."""

    def __init__(self, sites: list[AttentionSite], keep: str, options: dict[str, Any],
                 accumulators: Sequence[StreamingMetric] = ()):
        self.sites = sites
        self.keep = keep
        self.options = options
        self._maps: list[list[Tensor]] = [[] for _ in sites]
        self._locality = LocalityAccumulator(**options) if keep == "stats" else None  # keep=None: accumulators only
        self.accumulators: list[StreamingMetric] = [*([self._locality] if self._locality else []), *accumulators]
        self.layouts: list[TokenLayout | None] = [None for _ in sites]
        self._distances: dict[tuple, tuple[TokenLayout, Tensor]] = {}

    def _distances_on(self, layout: TokenLayout, device: torch.device) -> Tensor:
        """The layout's distance matrix (float32) on ``device``, moved once per layout and device."""
        key = (id(layout), device)
        if key not in self._distances:  # the layout is kept in the value, so its id cannot be reused
            self._distances[key] = (layout, layout.distance_matrix().to(device, torch.float32))
        return self._distances[key][1]

    def _observer(self, slot: int):
        index = self.sites[slot].index

        def observe(capture: Capture) -> None:
            self.layouts[slot] = capture.layout
            if self.keep == "maps":
                self._maps[slot].append(capture.probs().detach())
            if not self.accumulators:
                return
            for part in capture.parts or [capture]:  # images of one layout each, padding removed (NaFlexVit)
                layout = part.layout
                device = part.softmax_qk.k.device if part.softmax_qk is not None else part.probs().device
                batch = AttentionBatch(prefix=layout.num_prefix_tokens, distances=self._distances_on(layout, device),
                                       patch_size=layout.patch_size, geometry=(id(layout), device),
                                       load_probs=part.probs, softmax_qk=part.softmax_qk)
                for accumulator in self.accumulators:
                    accumulator.update(index, batch)

        return observe

    @property
    def maps(self) -> list[Tensor]:
        """Per recorded layer in block order, the probabilities (B, heads, Tq, Tk) of every batch seen."""
        if self.keep != "maps":
            raise ValueError("maps were not kept; record with keep='maps'")
        for chunks in self._maps:
            if len({tuple(c.shape[1:]) for c in chunks}) > 1:
                counts = sorted({c.shape[-1] for c in chunks})
                raise ValueError(f"the batches' maps have different token counts {counts} (NaFlex batches padded to "
                                 "different lengths, or inputs of different sizes) and cannot be joined; read "
                                 "rec.maps after each batch, or record with keep='stats'")
        return [torch.cat(chunks) if len(chunks) > 1 else (chunks[0] if chunks else None) for chunks in self._maps]

    @property
    def stats(self) -> AttentionStats:
        if self._locality is None:
            raise ValueError("statistics were not kept; record with keep='stats'")
        return self._locality.stats([site.index for site in self.sites])


def _chosen(layers: Sequence[int] | int | None, count: int) -> list[int]:
    """0-based indices from one index, several, or None for all (a range error names the valid ones)."""
    return resolve_block_indices([layers] if isinstance(layers, int) else layers, count)


@contextmanager
def record_attention(
    model: nn.Module,
    layers: Sequence[int] | int | None = None,
    keep: str | None = "maps",
    *,
    renormalize: bool = True,
    unit: str = "normalized",
    accumulators: Sequence[StreamingMetric] = (),
) -> Iterator[AttentionRecording]:
    """Observe the attention of ``layers`` (0-based index or indices; None = all) while the model runs.

    ``keep="maps"`` stores every map; ``keep="stats"`` keeps only running per-head MAD and entropy
    (``renormalize`` and ``unit`` as in ``vitscope.metrics.mean_attention_distance``), so memory does not
    grow with the data; ``keep=None`` keeps nothing itself and only hands batches to the ``accumulators``, which
    receive every recorded layer's batch in all modes (module docstring). Memory: a layer's probabilities are
    formed only when something asks for them, and dropped once the layer's accumulators have run, so ``stats``
    never holds two layers' maps at once. On exit, also after an error, the model is left exactly as it was.
    """
    if keep not in ("maps", "stats", None):
        raise ValueError(f"keep={keep!r} is unknown; use 'maps', 'stats' or None (accumulators only)")
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is unknown; use one of {', '.join(UNITS)}")
    for accumulator in accumulators:
        if not callable(getattr(accumulator, "update", None)):
            raise ValueError(f"accumulator {accumulator!r} has no update(layer, batch) method; use one from "
                             "vitscope.metrics or write one")
    all_sites = attention_sites(model)
    sites = [all_sites[i] for i in _chosen(layers, len(all_sites))]
    recording = AttentionRecording(sites, keep, {"renormalize": renormalize, "unit": unit}, accumulators)
    detachers = []
    try:
        for slot, site in enumerate(sites):
            detachers.append(site.attach(recording._observer(slot)))
        yield recording
    finally:
        for detach in reversed(detachers):
            detach()


class TokenRecording:
    """What ``record_tokens`` yields. Per recorded block, over every batch seen: ``tokens`` (B, T, D) output
    tokens before the final norm, ``normed`` the same after the model's final norm (plain ViTs; None for
    hierarchical models, or when recorded with ``final_norm=False``), or with ``keep="norms"`` only ``norms`` (B, T)
    and ``normed_norms``; with ``keep="normed"`` only ``normed``."""

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
            if self.keep != "normed":  # "normed" keeps only the final norm's output: half the memory of both
                self._raw[slot].append(tokens)
            if normed is not None:
                self._normed[slot].append(normed)

    def _gather(self, chunks: list[list[Tensor]]) -> list[Tensor | None]:
        return [torch.cat(c) if c else None for c in chunks]

    @property
    def tokens(self) -> list[Tensor]:
        if self.keep != "tokens":
            raise ValueError(f"tokens were not kept (keep={self.keep!r}); record with keep='tokens'")
        return self._gather(self._raw)

    @property
    def normed(self) -> list[Tensor | None]:
        if self.keep not in ("tokens", "normed"):
            raise ValueError("tokens were not kept; record with keep='tokens' or 'normed'")
        return self._gather(self._normed)

    @property
    def norms(self) -> list[Tensor]:
        if self.keep == "normed":
            raise ValueError("only the normed tokens were kept; read normed_norms, or record with keep='norms'")
        return self._gather(self._raw) if self.keep == "norms" else [token_norms(t) for t in self.tokens]

    @property
    def normed_norms(self) -> list[Tensor | None]:
        if self.keep == "norms":
            return self._gather(self._normed)
        return [token_norms(t) if t is not None else None for t in self.normed]


@contextmanager
def record_tokens(model: nn.Module, layers: Sequence[int] | int | None = None, keep: str = "tokens", *,
                  final_norm: bool = True) -> Iterator[TokenRecording]:
    """Record each chosen block's output tokens (0-based block indices; None = all) while the block runs.

    ``keep="norms"`` stores only token norms (B, T), a thousand times less memory than the tokens;
    ``keep="normed"`` only the tokens after the final norm. ``final_norm=False`` skips the final norm (``normed``
    and ``normed_norms`` are None): less time and memory where only the raw tokens are read. The model is left
    exactly as it was on exit, also after an error."""
    if keep not in ("tokens", "norms", "normed"):
        raise ValueError(f"keep={keep!r} is unknown; use 'tokens', 'norms' or 'normed'")
    blocks = token_blocks(model)
    chosen = _chosen(layers, len(blocks))
    norm = getattr(model, "norm", None) if hasattr(model, "num_prefix_tokens") and final_norm else None
    if keep == "normed" and norm is None:
        raise ValueError("keep='normed' needs a plain ViT's final norm (and final_norm=True); use keep='tokens'")
    recording = TokenRecording([blocks[i][0] for i in chosen], keep, norm)
    handles = []
    try:
        for slot, i in enumerate(chosen):
            handles.append(blocks[i][1].register_forward_hook(
                lambda _m, _inputs, output, slot=slot: recording._add(slot, output)))
        yield recording
    finally:
        for handle in handles:
            handle.remove()


def _count(images: float) -> str:
    """An image count as the bar shows it: whole, or with the finished share of a batch ("2.25")."""
    return str(int(images)) if float(images).is_integer() else f"{images:.2f}".rstrip("0")


class _ImageBar(tqdm):
    """A tqdm bar of images whose count may hold a fraction of a batch (``{images}`` in its format)."""

    @property
    def format_dict(self) -> dict[str, Any]:
        values = super().format_dict
        return values | {"images": _count(values["n"])}


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {images}/{total_fmt} img [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class BlockProgress:
    """An image bar (``bar``) that also advances as each block of the model finishes: after block b of L in a batch
    of B images it stands at (images done) + B b / L, so its rate and ETA move while a slow image runs. The caller
    reports each finished batch (``batch_done``), which sets the count exactly."""

    def __init__(self, bar: tqdm, blocks: list[nn.Module]):
        self.bar, self.blocks, self.done, self._batch = bar, blocks, 0, 0

    def _started(self, _module: nn.Module, inputs: tuple[Any, ...]) -> None:
        self._batch = int(inputs[0].shape[0]) if inputs and hasattr(inputs[0], "shape") else 0

    def _finished(self, index: int) -> None:
        if index + 1 < len(self.blocks):  # the last block's share is the caller's batch_done
            self.bar.set_postfix_str(f"block {index + 1}/{len(self.blocks)}", refresh=False)
            self.bar.update(self.done + self._batch * (index + 1) / len(self.blocks) - self.bar.n)

    def batch_done(self, images: int) -> None:
        self.done += images
        self.bar.set_postfix_str("", refresh=False)
        self.bar.update(self.done - self.bar.n)


@contextmanager
def block_progress(model: nn.Module, total: int, desc: str, enabled: bool = True) -> Iterator[BlockProgress]:
    """An image bar of ``total`` images (rate, ETA) advancing block by block while ``model`` runs inside the
    context (plain ViTs, Swin, PVT-v2; other models advance batch by batch). Hooks are removed on exit."""
    bar = _ImageBar(total=total, desc=desc, unit="img", disable=not enabled, dynamic_ncols=True,
                    bar_format=BAR_FORMAT)
    try:
        blocks = [block for _, block in token_blocks(model)] if enabled else []
    except ValueError:
        blocks = []
    progress = BlockProgress(bar, blocks)
    handles = []
    try:
        if blocks:
            handles.append(blocks[0].register_forward_pre_hook(progress._started))
            handles += [block.register_forward_hook(lambda *_, index=index: progress._finished(index))
                        for index, block in enumerate(blocks)]
        yield progress
    finally:
        for handle in handles:
            handle.remove()
        bar.close()
