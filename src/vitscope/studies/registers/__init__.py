"""The registers study (arXiv 2603.25803): high-norm token census, token probes, findings and presets."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
