"""The registers study (arXiv 2603.25803): the high-norm census, token probes, seed 004's claims judged, presets."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
