"""Dense probes (segmentation, depth) on frozen patch tokens: the probe, its heads, point-sampled losses, tiled
evaluation, sliding windows, and DINOv2's depth-bin normalisation."""

from vitscope.lazy_import import submodule_getattr

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
