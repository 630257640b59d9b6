"""The sparse-attention study (arXiv 2605.23868): DINO backbones by normaliser, measured and judged."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
