"""timm architectures inside vitscope: built without any download, loaded from local weights, modified.

``modify`` changes a loaded timm ViT in place, keeping its weights:
* ``attention``: every timm ``Attention`` becomes a vitscope ``Attention`` with that normaliser (same
  ``qkv`` / ``proj`` weights; no new parameters);
* ``num_registers``: R register tokens after CLS with no positional embedding (DINOv2 convention), newly
  initialised; existing weights untouched;
* ``img_size``: timm's own positional-embedding resampling (``set_input_size``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from vitscope.attention import Attention
from vitscope.models.checkpoint import load_weights


def create_timm(name: str, **overrides: Any) -> nn.Module:
    """A timm model ``name`` with random weights (``pretrained`` is never fetched)."""
    if overrides.pop("pretrained", False):
        raise ValueError(
            f"timm:{name} pretrained weights are not fetched; download them yourself and pass --weights PATH"
        )
    try:
        return timm.create_model(name, pretrained=False, **overrides)
    except RuntimeError as err:  # timm raises RuntimeError for unknown names
        raise ValueError(f"timm does not know the model {name!r} ({err}); see timm.list_models()") from None


def load_timm_weights(model: nn.Module, path: str | Path) -> None:
    """Load timm or original-repository weights (converted by the architecture's checkpoint_filter_fn)."""
    load_weights(model, path, convert=getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None))


def swap_attention(model: nn.Module, normalizer: str) -> int:
    """Replace every timm ViT ``Attention`` by vitscope's with ``normalizer``; returns how many."""
    from timm.models.vision_transformer import Attention as TimmAttention

    swapped = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, Attention):
                child.set_normalizer(normalizer)
                swapped += 1
            elif isinstance(child, TimmAttention):
                if not (isinstance(child.q_norm, nn.Identity) and isinstance(child.k_norm, nn.Identity)
                        and isinstance(getattr(child, "norm", nn.Identity()), nn.Identity)):
                    raise ValueError("this model normalises q/k inside attention; vitscope cannot swap its normaliser")
                dim = child.qkv.in_features
                new = Attention(dim, child.num_heads, qkv_bias=child.qkv.bias is not None, normalizer=normalizer,
                                attn_drop=child.attn_drop.p, proj_drop=child.proj_drop.p)
                copied = {k: v for k, v in child.state_dict().items() if k.startswith(("qkv", "proj"))}
                own = {k: v for k, v in new.state_dict().items() if k.startswith("normalizer.")}  # a learned alpha
                new.load_state_dict({**copied, **own})
                setattr(module, child_name, new.to(child.qkv.weight.device, child.qkv.weight.dtype))
                swapped += 1
    if not swapped:
        raise ValueError(f"{type(model).__name__} has no ViT attention modules to swap; attention= works on "
                         "timm VisionTransformer models")
    return swapped


def add_registers(model: nn.Module, count: int) -> None:
    """Add ``count`` register tokens after CLS (no positional embedding) to a timm VisionTransformer."""
    if count <= 0:
        return
    if not hasattr(model, "_pos_embed") or not hasattr(model, "num_prefix_tokens"):
        raise ValueError(f"num_registers= needs a timm VisionTransformer, not {type(model).__name__}")
    if getattr(model, "reg_token", None) is not None or getattr(model, "num_reg_tokens", 0):
        raise ValueError("this model already has registers; load it without num_registers=")
    dim = model.embed_dim
    ref = model.pos_embed if model.pos_embed is not None else next(model.parameters())
    model.vitscope_registers = nn.Parameter(torch.randn(1, count, dim, device=ref.device, dtype=ref.dtype) * 0.02)
    cls_count = model.num_prefix_tokens  # CLS (and nothing else) before registers are added
    original = model._pos_embed

    def pos_embed_with_registers(x: torch.Tensor) -> torch.Tensor:
        x = original(x)
        regs = model.vitscope_registers.expand(x.shape[0], -1, -1)
        return torch.cat([x[:, :cls_count], regs, x[:, cls_count:]], dim=1)

    model._pos_embed = pos_embed_with_registers
    model.num_reg_tokens = count
    model.num_prefix_tokens = cls_count + count


def modify(model: nn.Module, *, attention: str | None = None, num_registers: int = 0,
           img_size: int | None = None) -> nn.Module:
    """Apply the modifications described in the module docstring, in place; returns the model."""
    fixed_size = getattr(getattr(model, "patch_embed", None), "img_size", None) is not None
    if img_size is not None and fixed_size:  # models without a fixed size (PVT-v2) take any input as it is
        if not hasattr(model, "set_input_size"):
            raise ValueError(f"{type(model).__name__} cannot change its input size; drop img_size=")
        model.set_input_size(img_size=img_size)
    if attention is not None:
        swap_attention(model, attention)
    add_registers(model, num_registers)
    return model
