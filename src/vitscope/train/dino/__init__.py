"""The DINO objective: the objective itself, the projection head and multi-crop network, and the loss."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
