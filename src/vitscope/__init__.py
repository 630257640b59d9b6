"""vitscope: train, modify and measure how tokens interact inside Vision Transformers."""

from vitscope.threads import set_thread_count, set_wait_policy

set_wait_policy()  # before anything imports torch (vitscope.threads)
set_thread_count()

from vitscope.metrics import AttentionStats  # noqa: E402
from vitscope.record import record_attention, record_tokens  # noqa: E402
from vitscope.version import __version__  # noqa: E402


def explore(*args, **kwargs):
    """The interactive attention and token explorer page (``vitscope.explorer.explore``; docs/explore.md)."""
    from vitscope.explorer import explore as build_explorer

    return build_explorer(*args, **kwargs)


__all__ = ["AttentionStats", "__version__", "explore", "record_attention", "record_tokens"]
