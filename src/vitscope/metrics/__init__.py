"""Pure metric functions of tensors; they know nothing of models."""

from vitscope.metrics.locality import UNITS, attention_entropy, grid_distances, mean_attention_distance

__all__ = ["UNITS", "attention_entropy", "grid_distances", "mean_attention_distance"]
