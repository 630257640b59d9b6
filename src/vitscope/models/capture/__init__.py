"""Where attention and tokens are read: attention sites, what each delivers per forward pass, and token layouts
(plain grids, Swin windows, PVT-v2 reduced keys, NaFlex padding, RoPE families)."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
