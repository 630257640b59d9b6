"""Attention normalisers, their fast paths, and the multi-head attention module."""

from vitscope.attention.exactness import take_unproven, unproven_scalars
from vitscope.attention.learned import (
    NORMALIZER_NAMES,
    LearnedEntmax,
    NormalizerSpec,
    learned_alphas,
    make_normalizer,
    parse_normalizer,
)
from vitscope.attention.normalizers import (
    Entmax15,
    EntmaxAlpha,
    Normalizer,
    Softmax,
    Sparsemax,
    check_alpha,
    entmax,
    entmax15,
    softmax,
    sparsemax,
)
from vitscope.attention.paths import FastPaths, deferred_exactness, fast_paths
from vitscope.lazy_import import submodule_getattr

__all__ = [
    "NORMALIZER_NAMES", "Entmax15", "EntmaxAlpha", "FastPaths", "LearnedEntmax", "Normalizer", "NormalizerSpec",
    "Softmax", "Sparsemax", "check_alpha", "deferred_exactness", "entmax", "entmax15", "fast_paths",
    "learned_alphas", "make_normalizer", "parse_normalizer", "softmax", "sparsemax", "take_unproven",
    "unproven_scalars",
]
from vitscope.attention.module import (  # noqa: E402
    Attention,
    AttentionEvent,
    AttentionObserver,
    masked_logits,
    use_fused_attention,
)

__all__ += ["Attention", "AttentionEvent", "AttentionObserver", "masked_logits", "use_fused_attention"]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
