"""Which tokens are which: CLS, registers and patches with their grid coordinates; stage geometry of
hierarchical models."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitscope.models.capture.hierarchical import PvtReducedKeys, SwinWindows
from vitscope.models.capture.sites import attention_sites, token_layout


def token_map(model: nn.Module) -> dict[str, Any]:
    """A JSON-ready description of the model's tokens.

    Plain ViTs: indices of CLS, registers and patches, the patch grid and patch size (pixels). Swin and
    PVT-v2: per attention block, its stage grid, stride (pixels per token) and window / key reduction."""
    family = type(model).__name__
    if hasattr(model, "num_prefix_tokens") and hasattr(model, "blocks"):
        layout = token_layout(model)
        first_reg = int(layout.has_cls)
        return {
            "family": family, "kind": "plain",
            "cls": [0] if layout.has_cls else [],
            "registers": list(range(first_reg, first_reg + layout.num_registers)),
            "patches": {"start": layout.num_prefix_tokens, "count": layout.num_patches,
                        "grid": list(layout.grid_size), "patch_size": layout.patch_size},
            "num_prefix_tokens": layout.num_prefix_tokens,
        }
    blocks = []
    for site in attention_sites(model):
        entry: dict[str, Any] = {"name": site.name, "index": site.index}
        geometry = site.canonical
        if isinstance(geometry, SwinWindows):
            block = _parent_block(model, site.name)
            entry |= {"grid": list(geometry.layout.grid_size), "stride": geometry.layout.patch_size,
                      "window": list(block.window_size), "shift": list(block.shift_size)}
        elif isinstance(geometry, PvtReducedKeys):
            module = geometry.module
            reduction = "pool 7x7" if getattr(module, "pool", None) is not None else (
                f"stride {module.sr.stride[0]}" if getattr(module, "sr", None) is not None else "none")
            entry |= {"stride": geometry.stride, "key_reduction": reduction, "grid": "depends on the input size"}
        blocks.append(entry)
    return {"family": family, "kind": "hierarchical", "cls": [], "registers": [], "blocks": blocks}


def _parent_block(model: nn.Module, attn_name: str) -> nn.Module:
    return model.get_submodule(attn_name.rsplit(".", 1)[0])
