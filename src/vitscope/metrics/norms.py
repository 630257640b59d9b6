"""Token norms and high-norm ("artifact") token detection (definitions in docs/definitions.md).

A token's norm is the L2 norm of a block's output token (default: the last block, before the final norm).
A token is high-norm when its norm exceeds a threshold chosen by a spec:

* ``percentile:Q``: the Q-th percentile of the patch-token norms of the data (the registers reassessment
  uses 98);
* ``absolute:T``: a fixed value (Darcet et al. use 150 for DINOv2 ViT-g);
* ``auto``: the largest gap of a two-component split of the log norms: the split point that maximises the
  between-class variance (Otsu's criterion) of the sorted log norms; the threshold is the geometric
  midpoint between the two tokens on either side of the split.
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


def otsu_split(values: Tensor) -> float:
    """The threshold between the two classes of a 1-D sample that maximises between-class variance."""
    x = values.flatten().double().sort().values
    n = x.numel()
    if n < 2:
        return float(x.max()) if n else math.inf
    prefix = x.cumsum(0)
    k = torch.arange(1, n, dtype=torch.float64)
    mean_low = prefix[:-1] / k
    mean_high = (prefix[-1] - prefix[:-1]) / (n - k)
    between = k * (n - k) * (mean_high - mean_low) ** 2
    split = int(between.argmax())
    return float((x[split] + x[split + 1]) / 2)


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
    return Threshold(spec, math.exp(otsu_split(norms.clamp(min=1e-12).log())))


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
