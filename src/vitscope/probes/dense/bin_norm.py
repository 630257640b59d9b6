"""How a depth-bin head turns its logits into bin weights: DINOv2's ``norm_strategy``.

The head predicts one logit per depth bin; the depth is the weighted sum of the bin centres. ``linear`` (DINOv2's
default, after AdaBins): ReLU, plus 0.1, divided by the sum over bins. ``softmax``: a softmax over bins.
``sigmoid``: a sigmoid, divided by the sum. vitscope's depth probe uses ``linear`` unless told otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

BIN_NORMS = ("linear", "softmax", "sigmoid")
DEFAULT_BIN_NORM = "linear"
LINEAR_EPS = 0.1  # DINOv2's eps in the linear strategy


def raw_bin_weights(logits: Tensor, norm: str = DEFAULT_BIN_NORM, dim: int = 1) -> Tensor:
    """The strategy's weights before they are divided by their sum along ``dim`` (all positive)."""
    if norm == "linear":
        return logits.relu() + LINEAR_EPS
    if norm == "softmax":
        return (logits - logits.amax(dim=dim, keepdim=True)).exp()
    if norm == "sigmoid":
        return logits.sigmoid()
    raise ValueError(f"depth bin normalisation {norm!r} is unknown; use one of {', '.join(BIN_NORMS)}")


def bin_weights(logits: Tensor, norm: str = DEFAULT_BIN_NORM, dim: int = 1) -> Tensor:
    """Weights over the bins (summing to 1 along ``dim``) from ``logits`` by the strategy ``norm``."""
    if norm == "softmax":
        return logits.softmax(dim=dim)
    weights = raw_bin_weights(logits, norm, dim)
    return weights / weights.sum(dim=dim, keepdim=True)


def depth_from_bins(logits: Tensor, bins: Tensor, norm: str = DEFAULT_BIN_NORM) -> Tensor:
    """(B, bins, H, W) logits and (bins,) centres in metres -> (B, H, W) depth, the weighted sum of the centres."""
    return torch.einsum("bkhw,k->bhw", bin_weights(logits, norm, dim=1), bins)
