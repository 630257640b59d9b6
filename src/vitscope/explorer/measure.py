"""Run one model on the explored images and keep what the page shows: each layer's attention rows (its maps, or
its queries and keys: ``vitscope.explorer.rows``), per-head MAD and entropy, token norms and the high-norm threshold.

Each layer is read at its attention site as the model runs (``AttentionSite.attach``: the recorder's own captures)
and reduced batch by batch, so only one layer's maps of one batch are ever held at once.

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
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.explorer.geometry import layer_geometry
from vitscope.explorer.rows import ARITHMETIC, TOLERANCE, centred_keys, normalizer_spec, row_errors, stored_form
from vitscope.metrics import PerHeadMeans, attention_entropy, mean_attention_distance
from vitscope.metrics.norms import Threshold, high_norm_threshold
from vitscope.models import attention_sites
from vitscope.models.capture.delivery import Capture
from vitscope.record import record_tokens


@dataclass
class QKRows:
    """A layer's rows as queries (images, kept heads, Tq, d) and centred keys (images, kept heads, Tk, d), float32
    here, with the ``scale`` and the page's normaliser ``spec``. ``half`` (images, kept heads): whether that image's
    head is stored in float16 (else float32); ``error``: the largest error of its rows in that precision, measured
    against the recorder's float32 rows, as a fraction of each row's maximum."""

    queries: Tensor
    keys: Tensor
    scale: float
    spec: dict
    half: Tensor
    error: Tensor


@dataclass
class LayerRecord:
    """One recorded attention layer (``index`` 0-based): its rows, as maps (images, kept heads, rows, keys) float32
    on the CPU or as ``QKRows`` (the other None), per-image MAD and entropy (images, heads), set means (heads,), token
    norms (images, tokens) of its block's output, and its geometry (JSON part, index arrays)."""

    index: int
    heads: list[int]
    num_heads: int
    maps: Tensor | None
    mad_image: Tensor
    entropy_image: Tensor
    mad_set: Tensor
    entropy_set: Tensor
    skipped: Tensor
    norms: Tensor
    geometry: dict[str, Any]
    arrays: dict[str, Tensor] = field(default_factory=dict)
    rows: QKRows | None = None

    @property
    def form(self) -> str:
        return "maps" if self.rows is None else "qk"


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


class _LayerCollector:
    """Reduces one layer's captures, batch by batch: MAD and entropy per image, and the rows in the layer's form
    (decided at its first batch)."""

    def __init__(self, index: int, heads: Sequence[int] | None, rows: str, means: PerHeadMeans):
        self.index, self.heads, self.option, self.means = index, heads, rows, means
        self.layout = None
        self.form: str | None = None
        self.kept: list[int] = []
        self.spec: dict | None = None
        self.scale = 0.0
        names = ("mad", "entropy", "maps", "q", "k", "half", "error")
        self.parts: dict[str, list[Tensor]] = {name: [] for name in names}

    def __call__(self, capture: Capture) -> None:
        probs, layout = capture.probs().detach().float(), capture.layout
        self.layout = layout
        options = {"num_prefix_tokens": layout.num_prefix_tokens}
        mad = mean_attention_distance(probs, distances=layout.distance_matrix().to(probs.device), **options)
        entropy = attention_entropy(probs, **options)
        self.means.add(self.index, {"mad": mad, "entropy": entropy})
        self.parts["mad"].append(mad.cpu())
        self.parts["entropy"].append(entropy.cpu())
        self.kept = _kept_heads(self.heads, probs.shape[1])
        logits = capture.logit_inputs
        if self.form is None:
            self.spec = normalizer_spec(logits.normalizer, self.kept) if logits is not None else None
            self.form = stored_form(self.option, self.spec is not None, probs.shape[-2], probs.shape[-1],
                                    logits.q.shape[-1] if logits is not None else 0)
        reference = probs if len(self.kept) == probs.shape[1] else probs[:, self.kept]
        if self.form == "maps":
            self.parts["maps"].append(reference.cpu())
            return
        self.scale = float(logits.scale)
        q, k = logits.q[:, self.kept].detach().float(), centred_keys(logits.k[:, self.kept].detach().float())
        half = row_errors(q, k, self.scale, self.spec, reference, torch.float16)
        allowed = TOLERANCE - ARITHMETIC  # the bound the page states, measured error + ARITHMETIC, within TOLERANCE
        fits = half <= allowed  # NaN (a value past float16's range) keeps float32 too
        error = half.clone()
        for image, slot in (~fits).nonzero().tolist():  # these keep float32: measure that instead
            spec = _one_head(self.spec, slot)
            one = (slice(image, image + 1), slice(slot, slot + 1))
            error[image, slot] = row_errors(q[one], k[one], self.scale, spec, reference[one], torch.float32)[0, 0]
        worst = float(error.nan_to_num(nan=float("inf")).max()) if error.numel() else 0.0
        if worst > allowed:
            raise ValueError(f"layer {self.index + 1}: rows computed from float32 queries and keys differ from the "
                             f"recorder's by {worst:.2g} of the row maximum; this normaliser cannot be computed in "
                             "the page: store the maps instead (rows='maps', --rows maps)")
        for name, value in (("q", q), ("k", k), ("half", fits), ("error", error)):
            self.parts[name].append(value.cpu())

    def rows(self) -> QKRows | None:
        if self.form != "qk":
            return None
        joined = {name: torch.cat(self.parts[name]) for name in ("q", "k", "half", "error")}
        return QKRows(joined["q"], joined["k"], self.scale, self.spec, joined["half"], joined["error"])


def _one_head(spec: dict, slot: int) -> dict:
    """``spec`` for one kept head (its own alpha)."""
    return {**spec, "alpha": spec["alpha"][slot : slot + 1]} if "alpha" in spec else spec


@torch.no_grad()
def record_model(model: nn.Module, inputs: Tensor, label: str, *, layers: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, threshold: str = "percentile:98", detect_layer: int = -1,
                 batch_size: int = 16, device: torch.device | str = "cpu", rows: str = "auto") -> ModelRecord:
    """Record ``model`` on normalised ``inputs`` (images, 3, S, S). ``layers`` and ``heads`` are 0-based (None:
    all); ``detect_layer`` is the 0-based block whose patch-token norms set the threshold (-1: the last); ``rows``
    (auto, qk, maps) how each layer's rows are kept (``vitscope.explorer.rows.stored_form``)."""
    model = model.to(device).eval()
    sites = attention_sites(model)
    depth = len(sites)
    chosen = list(range(depth)) if layers is None else sorted({int(i) % depth for i in layers})
    means = PerHeadMeans()
    collectors = {index: _LayerCollector(index, heads, rows, means) for index in chosen}
    norms_seen: list[list[Tensor]] = []
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size].to(device)
        with ExitStack() as attached, record_tokens(model, keep="norms") as tokens:
            for index in chosen:
                attached.callback(sites[index].attach(collectors[index]))
            model(batch)
        norms_seen.append([n.cpu() for n in tokens.norms])
    norms = [torch.cat(per_block) for per_block in zip(*norms_seen, strict=True)]
    if len(norms) != depth:
        raise ValueError(f"{label}: {depth} attention layers but {len(norms)} token blocks; the explorer pairs block "
                         "l's attention with its output tokens, so the two must match")
    detect = detect_layer % len(norms)
    prefix = collectors[chosen[0]].layout.num_prefix_tokens
    rule = high_norm_threshold(norms[detect][:, prefix:], threshold)
    records = []
    for index in chosen:
        collector = collectors[index]
        num_heads = int(means.mean("mad", index).shape[0])
        geometry, arrays = layer_geometry(model, sites[index], collector.layout)
        parts = collector.parts
        records.append(LayerRecord(
            index=index, heads=_kept_heads(heads, num_heads), num_heads=num_heads,
            maps=torch.cat(parts["maps"]) if parts["maps"] else None,
            mad_image=torch.cat(parts["mad"]), entropy_image=torch.cat(parts["entropy"]),
            mad_set=means.mean("mad", index), entropy_set=means.mean("entropy", index),
            skipped=means.skipped("mad", index), norms=norms[index],
            geometry=geometry, arrays=arrays, rows=collector.rows()))
    fraction = float((norms[detect][:, prefix:] > rule.value).float().mean())
    return ModelRecord(label, depth, records, rule, detect, fraction)


def _kept_heads(heads: Sequence[int] | None, count: int) -> list[int]:
    """0-based heads kept of a layer with ``count`` heads (None: all; heads past ``count`` are left out)."""
    if heads is None:
        return list(range(count))
    kept = sorted({int(h) for h in heads if 0 <= int(h) < count})
    return kept or [0]
