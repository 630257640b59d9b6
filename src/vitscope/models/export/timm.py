"""Export a vitscope ViT as a timm ``VisionTransformer`` checkpoint: timm key names plus the constructor
arguments it needs.

The CLS token's positional embedding is folded into the CLS token itself (``no_embed_class=True``), which is
exact because both are constants; registers carry none in either model. A sine-cosine table is written as
a learned one. timm runs attention with softmax: a model trained with another normaliser keeps its
numbers only when loaded through ``vitscope.models.load("timm:...", weights=FILE, attention=...)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vitscope.atomic_io import atomic_write_bytes
from vitscope.models.own.vit import VisionTransformer

TIMM_ARGS_KEY = "timm_model_args"
ATTENTION_KEY = "vitscope_attention"


def timm_arguments(model: VisionTransformer) -> dict[str, Any]:
    """Keyword arguments of ``timm.models.vision_transformer.VisionTransformer`` that rebuild ``model``."""
    cfg = model.cfg
    return {"img_size": cfg.img_size, "patch_size": cfg.patch_size, "in_chans": cfg.in_chans,
            "num_classes": cfg.num_classes, "embed_dim": cfg.embed_dim, "depth": cfg.depth,
            "num_heads": cfg.num_heads, "mlp_ratio": cfg.mlp_ratio, "qkv_bias": cfg.qkv_bias,
            "class_token": cfg.class_token, "reg_tokens": cfg.num_registers, "no_embed_class": True,
            "global_pool": "token" if cfg.pool == "cls" else "avg", "fc_norm": False}


def timm_state_dict(model: VisionTransformer) -> dict[str, torch.Tensor]:
    """The weights under timm's names with the CLS positional embedding folded into ``cls_token``."""
    state = {k: v.detach().clone().contiguous().cpu() for k, v in model.state_dict().items()}
    pos = model.pos_embed.detach().clone().cpu()  # a buffer for sincos, so not always in the state dict
    if model.cls_token is not None:
        state["cls_token"] = state["cls_token"] + pos[:, :1]
        pos = pos[:, 1:]
    state["pos_embed"] = pos.contiguous()
    return state


def export_timm(model: VisionTransformer, path: str | Path) -> dict[str, Any]:
    """Write ``path`` (.safetensors) for timm; returns the timm arguments (also stored in the file's metadata)."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"export takes a vitscope model (a preset, run folder or vitscope weights file), "
                         f"not {type(model).__name__}")
    if model.cfg.cls_specialization:
        raise ValueError("export --format timm: this model's CLS token has its own norms and projections "
                         "(cls_specialization), which timm's VisionTransformer has not; load it with vitscope "
                         "(models.load of the run folder or file)")
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"export writes safetensors; name the output with a .safetensors suffix, not {path.name}")
    args = timm_arguments(model)
    tmp = path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(timm_state_dict(model), str(tmp),
              metadata={TIMM_ARGS_KEY: json.dumps(args), ATTENTION_KEY: model.cfg.attention})
    atomic_write_bytes(path, tmp.read_bytes())
    tmp.unlink()
    return args
