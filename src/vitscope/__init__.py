"""vitscope: train, modify and measure how tokens interact inside Vision Transformers."""
from vitscope.metrics import AttentionStats
from vitscope.record import record_attention, record_tokens
from vitscope.version import __version__


def explore(*args, **kwargs):
    """The interactive attention and token explorer page (``vitscope.explorer.explore``; docs/explore.md)."""
    from vitscope.explorer import explore as build_explorer

    return build_explorer(*args, **kwargs)


__all__ = ["AttentionStats", "__version__", "explore", "record_attention", "record_tokens"]
