"""vitscope: train, modify and measure how tokens interact inside Vision Transformers."""
__version__ = "0.1.0"

from vitscope.record import AttentionStats, record_attention, record_tokens  # noqa: E402

__all__ = ["AttentionStats", "__version__", "record_attention", "record_tokens"]
