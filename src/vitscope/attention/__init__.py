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
from vitscope.attention.module import (  # noqa: E402
    Attention,
    AttentionEvent,
    AttentionObserver,
    masked_logits,
    use_fused_attention,
)

__all__ += ["Attention", "AttentionEvent", "AttentionObserver", "masked_logits", "use_fused_attention"]
