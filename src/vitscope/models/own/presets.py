"""Named model presets; ``create(name, **overrides)`` builds one with random weights."""

from __future__ import annotations

from typing import Any

from vitscope.models.own.config import ViTConfig
from vitscope.models.own.vit import VisionTransformer

PRESETS: dict[str, ViTConfig] = {
    # small enough for CPU tests and demos: 8x8 patches of a 32 px image, 4 blocks of width 64
    "vit-micro": ViTConfig(img_size=32, patch_size=4, num_classes=10, depth=4, embed_dim=64, num_heads=4,
                           mlp_ratio=2.0),
    # the locality study's compact ViT (arXiv 2605.16390): 64 patches, depth 8, width 192, 8 heads
    "vit-compact": ViTConfig(img_size=32, patch_size=4, num_classes=100, depth=8, embed_dim=192, num_heads=8,
                             mlp_ratio=2.0),
    # DeiT sizes
    "vit-tiny": ViTConfig(img_size=224, patch_size=16, num_classes=1000, depth=12, embed_dim=192, num_heads=3,
                          mlp_ratio=4.0),
    "vit-small": ViTConfig(img_size=224, patch_size=16, num_classes=1000, depth=12, embed_dim=384, num_heads=6,
                           mlp_ratio=4.0),
}


def preset_config(name: str, **overrides: Any) -> ViTConfig:
    """The preset's config with ``overrides`` applied; unknown names raise a ValueError listing presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides)


def create(name: str, **overrides: Any) -> VisionTransformer:
    """A randomly initialised VisionTransformer from preset ``name`` with config ``overrides``."""
    return VisionTransformer(preset_config(name, **overrides))


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
