"""Export a ViT as a Hugging Face ``transformers`` ``save_pretrained`` folder that ``hf:FOLDER`` loads back.

The twin is ``Dinov2Model`` (``Dinov2WithRegistersModel`` with registers): a pre-norm ViT with a CLS token, learned
absolute positions on a square grid, registers after CLS without positions, fused-free q/k/v projections, LayerScale
and a final LayerNorm. A vitscope ``VisionTransformer`` and a timm ``VisionTransformer`` of that shape map onto it
exactly: timm's fused ``qkv`` is split into ``q_proj``/``k_proj``/``v_proj``; a model without LayerScale gets
``lambda1 = 1``; a table without a CLS entry (timm's ``no_embed_class``) gets a zero one. The table is written at the
model's current input size (``image_size`` of the config), so ``hf:FOLDER`` at that size uses it as it is, and the
tokens are the model's; at another size transformers resamples it its own way (bicubic, ``size = grid``).

Refused, in one line naming what and the fix: anything other than those two classes, no CLS token, no learned
absolute positions, a non-square grid, registers that carry positions, an attention normaliser other than softmax
(``--format timm`` keeps it for vitscope), parameters the twin has no place for (q/k-norm, gates, norms inside
attention or the MLP). Whatever the checks miss (another activation or norm epsilon) is caught by running both
models on one seeded batch: the twin's ``last_hidden_state`` must equal the model's final-norm tokens to 1e-4 of
their scale, or nothing is written. A classifier head is not exported (``Dinov2Model`` has none).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

TOLERANCE = 1e-4  # of the tokens' largest magnitude (at least 1)
_ACTIVATIONS = {("GELU", "none"): "gelu", ("GELU", "tanh"): "gelu_pytorch_tanh", ("QuickGELU", None): "quick_gelu"}


def _refuse(what: str, fix: str) -> ValueError:
    return ValueError(f"no faithful transformers twin: {what}; {fix}")


def _source_parts(model: nn.Module) -> tuple[dict[str, Tensor], int, int, nn.Module, Any]:
    """The model's tensors under timm's names, its patch size, registers, one block and the final norm."""
    from vitscope.models.own.vit import VisionTransformer

    if isinstance(model, VisionTransformer):
        if model.cfg.attention != "softmax":
            raise _refuse(f"the model uses {model.cfg.attention} attention and transformers runs softmax",
                          "export it with --format timm and load it through vitscope with attention=")
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
        state["pos_embed"] = model.pos_embed.detach()  # a sincos table is a buffer outside the state dict
        if model.cls_token is None:
            raise _refuse("the model has no CLS token", "export models with a class token")
        if model.cfg.cls_specialization:
            raise _refuse("its CLS token has its own norms and projections (cls_specialization), which Dinov2Model "
                          "has not", "load it with vitscope (models.load of the run folder or file)")
        return state, model.patch_size, model.num_registers, model.blocks[0], model.norm
    name = type(model).__name__
    if name != "VisionTransformer" or not type(model).__module__.startswith("timm."):
        raise _refuse(f"{name} is not a plain ViT", "export a vitscope model or a timm VisionTransformer (DeiT, "
                      "DINO, DINOv2, AugReg ...); hierarchical and rotary models have no Dinov2 twin")
    unusual = [m for m in model.modules() if hasattr(m, "normalizer") and type(m.normalizer).__name__ != "Softmax"]
    if unusual:
        raise _refuse(f"its attention uses {type(unusual[0].normalizer).__name__}, transformers runs softmax",
                      "load the model without attention=")
    if getattr(model, "cls_token", None) is None or getattr(model, "pos_embed", None) is None:
        raise _refuse("the model has no CLS token or no learned absolute positions", "export a ViT with both")
    registers = int(getattr(model, "num_reg_tokens", 0) or 0)
    table = model.pos_embed.detach()
    grid = tuple(model.patch_embed.grid_size)
    entries = table.shape[1] - grid[0] * grid[1]
    if entries == 0:  # no_embed_class: the CLS token carries no position, a zero entry in Dinov2's table
        table = torch.cat([torch.zeros_like(table[:, :1]), table], dim=1)
    elif entries != 1:
        raise _refuse(f"its {entries} prefix tokens carry positions (registers with positions)",
                      "export a model whose registers have none (no_embed_class, as DINOv2 with registers)")
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(("head.", "fc_norm."))}
    state["pos_embed"] = table
    patch = model.patch_embed.patch_size
    return state, int(patch[0] if isinstance(patch, tuple | list) else patch), registers, model.blocks[0], model.norm


def _activation(block: nn.Module) -> str:
    act = getattr(getattr(block, "mlp", None), "act", None)
    key = (type(act).__name__, getattr(act, "approximate", None))
    if key not in _ACTIVATIONS:
        raise _refuse(f"its MLP activation {key[0]} has no transformers name here", "export a GELU ViT")
    return _ACTIVATIONS[key]


def twin_config(model: nn.Module) -> tuple[Any, dict[str, Tensor]]:
    """The transformers config of the twin and the twin's state dict (transformers key names)."""
    import transformers

    state, patch, registers, block, norm = _source_parts(model)
    dim = int(state["patch_embed.proj.weight"].shape[0])
    depth = sum(1 for k in state if k.startswith("blocks.") and k.endswith(".norm1.weight"))
    grid = (state["pos_embed"].shape[1] - 1) ** 0.5
    if grid != int(grid):
        raise _refuse("its position table is not a square grid", "export it at a square input size (--img-size)")
    hidden = int(state["blocks.0.mlp.fc1.weight"].shape[0])
    if hidden % dim:
        raise _refuse(f"its MLP width {hidden} is not a whole multiple of the width {dim} (Dinov2Config's mlp_ratio "
                      "is an integer)", "export a ViT with an integer MLP ratio")
    options = dict(hidden_size=dim, num_hidden_layers=depth, num_attention_heads=int(block.attn.num_heads),
                   mlp_ratio=hidden // dim, hidden_act=_activation(block), layer_norm_eps=float(norm.eps),
                   image_size=int(grid) * patch, patch_size=patch, num_channels=int(state["patch_embed.proj.weight"]
                                                                                   .shape[1]),
                   qkv_bias="blocks.0.attn.qkv.bias" in state, layerscale_value=1.0, use_swiglu_ffn=False)
    if registers:
        config = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **options)
    else:
        config = transformers.Dinov2Config(**options)
    return config, _twin_state(state, depth, dim, registers)


def _twin_state(state: dict[str, Tensor], depth: int, dim: int, registers: int) -> dict[str, Tensor]:
    """timm names -> Dinov2 names; a key left over is a part the twin has no place for (refused)."""
    left = dict(state)
    take = left.pop
    out = {"embeddings.cls_token": take("cls_token"), "embeddings.mask_token": torch.zeros(1, dim),
           "embeddings.position_embeddings": take("pos_embed"),
           "embeddings.patch_embeddings.projection.weight": take("patch_embed.proj.weight"),
           "embeddings.patch_embeddings.projection.bias": left.pop("patch_embed.proj.bias", torch.zeros(dim)),
           "layernorm.weight": take("norm.weight"), "layernorm.bias": take("norm.bias")}
    if registers:
        out["embeddings.register_tokens"] = take("reg_token")
    for i in range(depth):
        src, dst = f"blocks.{i}.", f"encoder.layer.{i}."
        for part in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            for kind in ("weight", "bias"):
                out[f"{dst}{part}.{kind}"] = take(f"{src}{part}.{kind}")
        q, k, v = take(f"{src}attn.qkv.weight").chunk(3)
        out.update({f"{dst}attention.q_proj.weight": q, f"{dst}attention.k_proj.weight": k,
                    f"{dst}attention.v_proj.weight": v, f"{dst}attention.o_proj.weight": take(f"{src}attn.proj.weight"),
                    f"{dst}attention.o_proj.bias": take(f"{src}attn.proj.bias")})
        if f"{src}attn.qkv.bias" in left:
            for name, bias in zip("qkv", take(f"{src}attn.qkv.bias").chunk(3), strict=True):
                out[f"{dst}attention.{name}_proj.bias"] = bias
        for j in (1, 2):
            out[f"{dst}layer_scale{j}.lambda1"] = left.pop(f"{src}ls{j}.gamma", torch.ones(dim))
    if left:
        raise _refuse(f"the twin has no place for {sorted(left)[0]} ({len(left)} such tensors)",
                      "export a plain ViT (no q/k-norm, gates or extra norms)")
    return {k: v.detach().clone().float().contiguous() for k, v in out.items()}


def _tokens(model: nn.Module, images: Tensor) -> Tensor:
    """The model's final-norm tokens (B, T, D), [CLS] [registers] [patches]."""
    out = model.forward_features(images)
    if isinstance(out, dict):
        return torch.cat([out["cls"][:, None], out["registers"], out["patches"]], dim=1)
    return out


def build_twin(model: nn.Module, seed: int = 0) -> nn.Module:
    """The transformers twin of ``model``, checked on one seeded batch at the model's input size."""
    import transformers

    config, state = twin_config(model)
    cls = transformers.Dinov2WithRegistersModel if hasattr(config, "num_register_tokens") else transformers.Dinov2Model
    twin = cls(config).eval()
    twin.load_state_dict(state, strict=True)
    side = config.image_size
    images = torch.randn(2, config.num_channels, side, side, generator=torch.Generator().manual_seed(seed))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            want = _tokens(model, images.to(next(model.parameters()).device)).float().cpu()
            got = twin(pixel_values=images).last_hidden_state
    finally:
        model.train(was_training)
    error, scale = float((got - want).abs().max()), max(1.0, float(want.abs().max()))
    if error > TOLERANCE * scale:
        raise _refuse(f"{cls.__name__} gives tokens {error:.3g} away from the model's (scale {scale:.3g})",
                      "the model differs from a DINOv2-shaped ViT in a way vitscope does not map (activation, norm)")
    return twin


def processor_config(cfg: dict[str, Any], side: int) -> dict[str, Any] | None:
    """The ``preprocessor_config.json`` (a ``BitImageProcessor``) that gives, at input side ``side``, the view a
    model's pretrained config names (timm's keys: ``crop_pct``, ``crop_mode``, ``interpolation``, ``mean``,
    ``std``; ``resize_size`` where an adapter wrote one): the shortest edge (``center``) or both sides
    (``squash``) resized to ``floor(side / crop_pct)`` as timm computes it, then the centre ``side`` x ``side``.
    None for a model that names no mean and std (vitscope's own: its dataset's). transformers cuts the centre at
    ``excess // 2`` where timm's torchvision CenterCrop rounds half to even: where the excess is 3, 7, 11, ... pixels
    (3 modulo 4) the exported view sits one pixel higher (or further left)."""
    if "mean" not in cfg or "std" not in cfg:
        return None
    crop_pct = float(cfg.get("crop_pct") or 1.0)
    native = (cfg.get("input_size") or (None, None, side))[-1]
    scale = cfg.get("resize_size") if native == side else None
    scale = max(side, int(scale or math.floor(side / crop_pct)))
    mode = cfg.get("crop_mode") or "center"
    if mode not in ("center", "squash"):
        raise _refuse(f"its view's crop_mode {mode!r} pads the image, which a transformers image processor does not "
                      "do", "export a model whose pretrained config views by centre crop or squash")
    return {"image_processor_type": "BitImageProcessor", "do_resize": True,
            "size": {"shortest_edge": scale} if mode == "center" else {"height": scale, "width": scale},
            # PIL's code for the view's resampling: bicubic where the model names it, else bilinear
            "resample": 3 if cfg.get("interpolation") == "bicubic" else 2,
            "do_center_crop": True, "crop_size": {"height": side, "width": side},
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": list(cfg["mean"]), "image_std": list(cfg["std"]), "do_convert_rgb": True}


def export_hf(model: nn.Module, folder: str | Path) -> dict[str, Any]:
    """Write ``folder`` (config.json, model.safetensors, and, when the model knows its mean and std, a
    preprocessor_config.json giving its view: ``processor_config``) atomically: built beside it, then renamed.
    Returns what was written (class, image size)."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"--out {folder} exists and is not an empty folder; name a new folder for the export")
    twin = build_twin(model)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    logs = __import__("transformers").utils.logging
    bars = logs.is_progress_bar_enabled()
    logs.disable_progress_bar()  # its shard-writing bar: the CLI says in one line what it wrote
    try:
        twin.save_pretrained(tmp)
        processor = processor_config(getattr(model, "pretrained_cfg", None) or {}, twin.config.image_size)
        if processor is not None:
            (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
        if folder.exists():
            folder.rmdir()
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bars:
            logs.enable_progress_bar()
    return {"class": type(twin).__name__, "image_size": twin.config.image_size}
