"""Packed training: K supervised runs trained as one model, with a packed AdamW and per-member state."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
