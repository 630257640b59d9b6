"""Writing a model out for other libraries: a timm checkpoint, a Hugging Face ``save_pretrained`` folder."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
