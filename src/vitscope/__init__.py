"""vitscope: train, modify and measure how tokens interact inside Vision Transformers."""
from vitscope.metrics import AttentionStats
from vitscope.record import record_attention, record_tokens
from vitscope.version import __version__

__all__ = ["AttentionStats", "__version__", "record_attention", "record_tokens"]
