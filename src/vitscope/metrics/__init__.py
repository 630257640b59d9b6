"""Pure metric functions of tensors and streaming accumulators; they know nothing of models."""

from vitscope.lazy_import import submodule_getattr
from vitscope.metrics.attention_stats import AttentionStats
from vitscope.metrics.layers import early_layers
from vitscope.metrics.locality import (
    UNITS,
    attention_entropy,
    grid_distances,
    mean_attention_distance,
    uniform_mad,
)
from vitscope.metrics.streaming import (
    AttentionBatch,
    LocalityAccumulator,
    PerHeadMeans,
    SoftmaxInputs,
    StreamingMetric,
    SupportAccumulator,
)

__all__ = [
    "UNITS", "AttentionBatch", "AttentionStats", "LocalityAccumulator", "PerHeadMeans", "SoftmaxInputs",
    "StreamingMetric", "SupportAccumulator", "attention_entropy", "early_layers", "grid_distances",
    "mean_attention_distance", "uniform_mad",
]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
