"""Attention normalisers and the multi-head attention module."""

from vitscope.attention.normalizers import (
    NORMALIZER_NAMES,
    Entmax15,
    EntmaxAlpha,
    Normalizer,
    Softmax,
    Sparsemax,
    check_alpha,
    entmax,
    entmax15,
    make_normalizer,
    softmax,
    sparsemax,
)

__all__ = [
    "NORMALIZER_NAMES", "Entmax15", "EntmaxAlpha", "Normalizer", "Softmax", "Sparsemax", "check_alpha",
    "entmax", "entmax15", "make_normalizer", "softmax", "sparsemax",
]
from vitscope.attention.module import Attention, AttentionObserver, use_fused_attention  # noqa: E402

__all__ += ["Attention", "AttentionObserver", "use_fused_attention"]
