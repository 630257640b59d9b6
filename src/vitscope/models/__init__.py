"""Vision Transformers: the one entry point for models (``load``, ``create``) and the contract they share.

Sub-packages, one job each (docs/code-layout.md):
- ``own``: vitscope's own ViT (config, presets, the packed K-model form, planted outliers);
- ``adapters``: other libraries' models given vitscope's contract (timm, Hugging Face transformers, OpenCLIP);
- ``weights``: finding and reading weights (local hub caches, checkpoint files and their origins, position tables);
- ``export``: writing a model out for timm or transformers;
- ``capture``: where attention and tokens are read (attention sites, token layouts, hierarchical geometry).
``loading.load`` composes them, top to bottom.
"""

from __future__ import annotations

from vitscope.lazy_import import submodule_getattr
from vitscope.models.capture.layout import TokenLayout
from vitscope.models.capture.sites import AttentionSite, attention_sites, token_layout
from vitscope.models.loading import has_random_weights, load
from vitscope.models.own.config import ViTConfig
from vitscope.models.own.presets import PRESETS, count_parameters, create, preset_config
from vitscope.models.own.vit import VisionTransformer
from vitscope.models.weights.checkpoint import load_model, load_weights, save_model
from vitscope.models.weights.resize import check_img_size, resize_input

__all__ = [
    "PRESETS", "AttentionSite", "TokenLayout", "ViTConfig", "VisionTransformer", "attention_sites",
    "check_img_size", "count_parameters", "create", "has_random_weights", "load", "load_model", "load_weights",
    "preset_config", "resize_input", "save_model",
    "token_layout",
]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
