"""vitscope's own Vision Transformer: its config, presets, the packed K-model form and planted outliers."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
