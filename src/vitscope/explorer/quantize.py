"""Attention rows stored as 8-bit codes with one bin width per row; exact zeros kept exact.

A row ``p`` (probabilities over its keys) with maximum ``s`` gets the bin width ``step = max(s / levels,
2 floor)``: relative precision (``levels`` bins up to the row maximum, 255 at most) down to an absolute error floor
``floor`` (0: none), which makes diffuse rows cheap to store without changing how far any value may be off.

* code 0 means exactly 0 (entmax and sparsemax zeros, or a softmax that underflowed);
* a positive ``p`` gets ``code = ceil(p / step)`` in 1..levels, decoded to the bin centre ``(code - 0.5) step``.

So a shown probability is off by at most ``step / 2 = max(s / (2 levels), floor)`` (plus float32 rounding of the
decoded value, about 1e-7 s), and a zero is never confused with a small value. ``dequantize`` is the decoder the
page's JavaScript mirrors.
"""

from __future__ import annotations

import torch
from torch import Tensor


def quantize_rows(probs: Tensor, levels: int = 255, floor: float = 0.0) -> tuple[Tensor, Tensor]:
    """(codes uint8 of ``probs``' shape, bin widths float32 of its shape without the last axis) for rows on the
    last axis; ``levels`` in 1..255, ``floor`` >= 0 the absolute error floor."""
    if not 1 <= levels <= 255:
        raise ValueError(f"levels={levels} must lie in 1..255 (codes are 8-bit, 0 is reserved for exact zeros)")
    if floor < 0:
        raise ValueError(f"floor={floor} must be >= 0 (an absolute error on probabilities)")
    p = probs.detach().float()
    steps = (p.amax(dim=-1).double() / levels).clamp(min=max(2 * floor, torch.finfo(torch.float32).tiny))
    codes = torch.ceil(p.double() / steps.unsqueeze(-1)).clamp(0, levels)  # float64: the bin edges hold exactly
    codes = torch.where(p > 0, codes.clamp(min=1), torch.zeros_like(codes))
    return codes.to(torch.uint8), steps.float()


def dequantize(codes: Tensor, steps: Tensor) -> Tensor:
    """Probabilities (float32) from ``quantize_rows``' codes and bin widths."""
    values = (codes.float() - 0.5) * steps.float().unsqueeze(-1)
    return torch.where(codes > 0, values, torch.zeros_like(values))


def max_error_bound(steps: Tensor) -> float:
    """The largest error any decoded probability can have: half the widest bin."""
    return float(steps.max()) / 2 if steps.numel() else 0.0
