"""Token norms and high-norm ("artifact") token detection (definitions in docs/definitions.md).

A token's norm is the L2 norm of a block's output token (default: the last block, before the final norm).
A token is high-norm when its norm exceeds a threshold chosen by a spec:

* ``percentile:Q``: the Q-th percentile of the patch-token norms of the data (vitscope's choice of Q = 98 in the
  registers study; the reassessment's threshold is not in its seed);
* ``absolute:T``: a fixed value (Darcet et al. use 150 for DINOv2 ViT-g);
* ``auto``: the split at the largest gap in the upper tail of the log norms (``largest_gap_split``): among the
  splits that leave between ``max(MIN_COUNT, MIN_FRACTION n)`` and ``MAX_FRACTION n`` of the n tokens above, the
  one with the widest empty interval between the sorted log norms on either side; the threshold is the geometric
  midpoint of that interval. Whether the tokens above it form a population of their own (a separate high-norm
  mode) or the tail of one distribution is ``vitscope.metrics.high_norm.separate_mode``'s test of that gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


def token_norms(tokens: Tensor) -> Tensor:
    """L2 norms (B, T) of tokens (B, T, D), computed in float32."""
    if tokens.ndim != 3:
        raise ValueError(f"tokens must be (batch, tokens, dim), got shape {tuple(tokens.shape)}")
    return tokens.float().norm(dim=-1)


@dataclass(frozen=True)
class Threshold:
    spec: str
    value: float


def parse_threshold(spec: str) -> tuple[str, float | None]:
    """('percentile', Q), ('absolute', T) or ('auto', None); a ValueError names the valid forms."""
    text = spec.strip().lower()
    if text == "auto":
        return "auto", None
    kind, _, number = text.partition(":")
    try:
        value = float(number)
    except ValueError:
        value = None
    if kind not in ("percentile", "absolute") or value is None or (kind == "percentile" and not 0 < value < 100):
        raise ValueError(f"threshold {spec!r} is unknown; use percentile:Q (0 < Q < 100), absolute:T or auto")
    if kind == "absolute" and not 0 < value < math.inf:  # every norm is >= 0: T <= 0 would flag every token
        raise ValueError(f"threshold {spec!r}: absolute:T needs a token norm T > 0, e.g. absolute:100")
    return kind, value


MAX_FRACTION = 0.10  # a split leaves at most this share of the tokens above it ...
MIN_FRACTION = 0.001  # ... and at least this share ...
MIN_COUNT = 5  # ... and at least this many tokens (fewer is a handful of extremes, not a mode)


@dataclass(frozen=True)
class GapSplit:
    """The largest-gap split of one sample of norms: ``threshold`` (a norm, the geometric midpoint of the gap),
    ``above`` tokens of ``n`` above it, the ``gap`` (width of the empty interval, natural log units), ``iqr`` (the
    interquartile range of the log norms, the bulk's spread) and the ``median`` norm."""

    threshold: float
    above: int
    n: int
    gap: float
    iqr: float
    median: float


def largest_gap_split(norms: Tensor | np.ndarray) -> GapSplit:
    """The split at the largest gap in the upper tail of the log norms (module docstring), numpy only: sort the log
    norms, and among the splits with k tokens above, ``max(MIN_COUNT, ceil(MIN_FRACTION n)) <= k <= MAX_FRACTION n``
    (at least one token above when n is small), take the widest gap between the k-th and (k+1)-th largest."""
    values = np.asarray(norms.detach().cpu() if isinstance(norms, Tensor) else norms, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("no norms to split; record at least one image")
    logs = np.sort(np.log(np.clip(values, 1e-12, None)))
    n = logs.size
    q1, q3 = np.percentile(logs, [25, 75])
    median = float(np.median(values))
    if n < 2:
        return GapSplit(float(values.max()), 0, n, 0.0, float(q3 - q1), median)
    most = min(max(1, int(MAX_FRACTION * n)), n - 1)
    fewest = min(max(MIN_COUNT, math.ceil(MIN_FRACTION * n)), most)
    above = np.arange(fewest, most + 1)
    gaps = logs[n - above] - logs[n - above - 1]
    best = int(np.argmax(gaps))
    k = int(above[best])
    threshold = float(np.exp((logs[n - k] + logs[n - k - 1]) / 2))
    return GapSplit(threshold, int((values > threshold).sum()), n, float(gaps[best]), float(q3 - q1), median)


def high_norm_threshold(patch_norms: Tensor, spec: str = "percentile:98") -> Threshold:
    """The high-norm threshold for a sample of patch-token norms (any shape)."""
    kind, value = parse_threshold(spec)
    norms = patch_norms.flatten().float()
    if kind == "absolute":
        return Threshold(spec, value)
    if norms.numel() == 0:
        raise ValueError("no patch-token norms to set a threshold from; record at least one image")
    if kind == "percentile":
        return Threshold(spec, float(torch.quantile(norms.double(), value / 100.0)))
    return Threshold(spec, largest_gap_split(norms).threshold)


def log_histograms(norms: dict[str, list[Tensor]], layers: list[int], bins: int = 48) -> dict[str, Any]:
    """Histograms of token norms on ``bins`` log-spaced edges shared by every group and layer (``norms``: group ->
    one tensor per layer of ``layers``): ``{"edges": [...], "counts": {group: {str(layer): [...]}}}``; empty
    tensors are left out."""
    values = torch.cat([t.flatten() for group in norms.values() for t in group if t.numel()])
    positive = values[values > 0]
    low, high = (float(positive.min()), float(positive.max())) if positive.numel() else (1e-3, 1.0)
    edges = np.logspace(math.log10(low), math.log10(high * 1.001 + 1e-12), bins + 1)
    counts = {group: {str(layer): np.histogram(t.numpy(), bins=edges)[0].tolist()
                      for layer, t in zip(layers, tensors, strict=True) if t.numel()}
              for group, tensors in norms.items()}
    return {"edges": edges.tolist(), "counts": counts}
