"""Attention rows stored as 8-bit codes with one scale per row; exact zeros kept exact.

A row ``p`` (probabilities over its keys) with scale ``s = max(p)`` is coded with ``levels`` bins (255 at most):

* code 0 means exactly 0 (entmax and sparsemax zeros, or a softmax that underflowed);
* a positive ``p`` gets ``code = ceil(p / s * levels)`` in 1..levels, decoded to the bin centre
  ``(code - 0.5) / levels * s``.

So a shown probability is off by at most ``s / (2 levels)`` <= ``1 / (2 levels)`` (plus float32 rounding of the
decoded value, about 1e-7 s), and a zero is never confused
with a small value. ``dequantize`` is the decoder the page's JavaScript mirrors.
"""

from __future__ import annotations

import torch
from torch import Tensor


def quantize_rows(probs: Tensor, levels: int = 255) -> tuple[Tensor, Tensor]:
    """(codes uint8 of ``probs``' shape, scales float32 of its shape without the last axis) for rows on the last
    axis; ``levels`` in 1..255."""
    if not 1 <= levels <= 255:
        raise ValueError(f"levels={levels} must lie in 1..255 (codes are 8-bit, 0 is reserved for exact zeros)")
    p = probs.detach().float()
    scales = p.amax(dim=-1)
    safe = scales.double().clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(-1)
    codes = torch.ceil(p.double() / safe * levels).clamp(0, levels)  # float64: the bin edges hold exactly
    codes = torch.where(p > 0, codes.clamp(min=1), torch.zeros_like(codes))
    return codes.to(torch.uint8), scales


def dequantize(codes: Tensor, scales: Tensor, levels: int = 255) -> Tensor:
    """Probabilities (float32) from ``quantize_rows``' codes and scales."""
    values = (codes.float() - 0.5) / levels * scales.float().unsqueeze(-1)
    return torch.where(codes > 0, values, torch.zeros_like(values))


def max_error_bound(scales: Tensor, levels: int = 255) -> float:
    """The largest error any decoded probability can have: max(scale) / (2 levels)."""
    return float(scales.max()) / (2 * levels) if scales.numel() else 0.0
