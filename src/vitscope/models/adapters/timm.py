"""timm architectures inside vitscope: built without any download, loaded from local weights, modified.

Modifications use timm's own construction hooks, so the model is what timm would build:
* ``attention``: timm builds every block with ``attn_layer=`` a vitscope ``Attention`` with that normaliser
  (timm's parameter names, q/k-norm, scale-norm and gate carried over; no new parameters). An attention
  vitscope cannot reproduce (differential attention, fused-projection blocks, another head width) is refused;
* ``num_registers``: timm's ``reg_tokens=`` (after CLS, no positional embedding), on models built with
  ``no_embed_class`` only (elsewhere timm would give registers positional embeddings and pretrained weights
  would no longer load); registers are newly initialised, every other weight loads as before;
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
from vitscope.models.capture.sites import is_timm_vit_attention
from vitscope.models.weights import origins
from vitscope.models.weights.checkpoint import convert_or_refuse, read_state_dict
from vitscope.models.weights.hub import CachedFile
from vitscope.models.weights.origins import LoadReport
from vitscope.models.weights.resize import check_img_size

# The submodules of timm's ViT Attention that vitscope's Attention reproduces, under the same names.
KNOWN_PARTS = {"qkv", "q_norm", "k_norm", "attn_drop", "norm", "gate", "proj", "proj_drop"}


def create_timm(name: str, *, attention: str | None = None, num_registers: int = 0, **overrides: Any) -> nn.Module:
    """A timm model ``name`` with random weights (``pretrained`` is never fetched), built with vitscope's
    attention (``attention``: a normaliser spec) and ``num_registers`` registers when asked."""
    if overrides.pop("pretrained", False):  # vitscope.models.load resolves pretrained weights from the caches
        raise ValueError(f"create_timm builds timm:{name} with random weights; load pretrained weights with "
                         f"vitscope.models.load('timm:{name}', pretrained=True)")
    if attention is not None or num_registers:
        probe = _build(name, overrides, device="meta")
        if attention is not None:
            overrides["attn_layer"] = vitscope_attn_layer(probe, attention)
        if num_registers:
            _check_registers(probe, num_registers)
            overrides["reg_tokens"] = num_registers
    model = _build(name, overrides)
    model.vitscope_added_registers = num_registers  # registers the file need not have
    return model


def check_timm_img_size(name: str, img_size: int, overrides: dict[str, Any]) -> int:
    """``img_size`` checked against timm:``name``'s patch size (read from the architecture built on the meta
    device, no memory) before any weights are read: timm itself would floor 225 px to a 16 x 16 grid at patch 14."""
    probe = _build(name, dict(overrides), device="meta")
    embed = getattr(probe, "patch_embed", None) or getattr(probe, "embeds", None)
    patch = getattr(embed, "patch_size", None)
    proj = getattr(embed, "proj", None)
    overlapping = isinstance(proj, nn.Conv2d) and tuple(proj.stride) != tuple(proj.kernel_size)
    if patch is None or overlapping:  # no patchify of timm's kind (PVT-v2's overlapping 7 x 7 convolution at stride
        return img_size  # 4, padded, takes any size): nothing to check
    return check_img_size(img_size, int(patch[0] if isinstance(patch, tuple | list) else patch), f"timm:{name}")


def _build(name: str, overrides: dict[str, Any], device: str | None = None) -> nn.Module:
    try:
        if device is None:
            return timm.create_model(name, pretrained=False, **overrides)
        with torch.device(device):  # structure only, no memory: to inspect before building
            return timm.create_model(name, pretrained=False, **overrides)
    except RuntimeError as err:  # timm raises RuntimeError for unknown names
        raise ValueError(f"timm does not know the model {name!r} ({err}); see timm.list_models()") from None


def vitscope_attn_layer(model: nn.Module, normalizer: str) -> type[Attention]:
    """The ``attn_layer`` class that makes timm build ``model``'s blocks with vitscope's Attention and
    ``normalizer``; refuses a model whose attention it cannot reproduce exactly."""
    pool = getattr(model, "attn_pool", None)  # a MAP pooling head (SigLIP) keeps its softmax: it is not a block's
    pooling = set(map(id, pool.modules())) if isinstance(pool, nn.Module) else set()
    found = [m for m in model.modules() if is_timm_vit_attention(m) and id(m) not in pooling]
    other = sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__
                    and not is_timm_vit_attention(m) and m is not model and id(m) not in pooling})
    if other or not found:
        what = f"its {', '.join(other)} modules" if other else "it has no timm ViT Attention modules"
        rope = sorted(set(other) & {"EvaAttention", "AttentionRope"})
        if rope:
            what += (f" apply rotary position embeddings inside attention ({', '.join(rope)}), which vitscope's "
                     "Attention does not; record it with its own softmax attention instead")
        raise ValueError(f"cannot give {type(model).__name__} vitscope's attention: {what}; attention= works on "
                         "timm VisionTransformer models with timm's Attention (plain, q/k-norm, gated)")
    if len(found) != len(getattr(model, "blocks", ())):
        raise ValueError(f"cannot give {type(model).__name__} vitscope's attention: its blocks "
                         f"({type(model.blocks[0]).__name__}) do not each hold one timm Attention (fused projections?)")
    gated = {m.gate is not None for m in found}
    for m in found:
        unknown = {n for n, _ in m.named_children()} - KNOWN_PARTS
        if unknown or m.attn_dim != m.qkv.in_features:
            why = f"parts {sorted(unknown)}" if unknown else f"head width {m.head_dim} x {m.num_heads} heads"
            raise ValueError(f"cannot convert timm Attention with {why} to vitscope's attention")
    if len(gated) > 1:
        raise ValueError("cannot convert a model whose blocks mix gated and ungated attention")
    return _attention_class(normalizer, gated.pop())


def _attention_class(normalizer: str, gated: bool) -> type[Attention]:
    """A subclass of vitscope's Attention with timm's constructor and the normaliser fixed (timm wants a class)."""

    class TimmBuiltAttention(Attention):
        def __init__(self, dim: int, num_heads: int = 8, **timm_options: Any):
            super().__init__(dim, num_heads, normalizer=normalizer, gated=gated, **timm_options)

    TimmBuiltAttention.__qualname__ = TimmBuiltAttention.__name__ = f"Attention_{normalizer.replace(':', '_')}"
    return TimmBuiltAttention


def _check_registers(model: nn.Module, count: int) -> None:
    if count < 0:
        raise ValueError(f"num_registers={count} must be >= 0")
    if not hasattr(model, "no_embed_class") or not hasattr(model, "num_prefix_tokens"):
        raise ValueError(f"num_registers= needs a timm VisionTransformer, not {type(model).__name__}")
    if getattr(model, "num_reg_tokens", 0):
        raise ValueError("this model already has registers; load it without num_registers=")
    if not model.no_embed_class:
        raise ValueError(f"{type(model).__name__} gives its class token a positional embedding (no_embed_class="
                         "False), so timm would give registers one too and its weights would not load; add "
                         "registers to models built with no_embed_class (DeiT-III, DINOv2) or to vitscope presets")


def load_timm_weights(model: nn.Module, path: str | Path, pos_interp: str | None = None,
                      source: CachedFile | None = None) -> LoadReport:
    """Load timm or original-repository weights (``vitscope.models.weights.origins``: origin from the keys, positions
    interpolated as the origin's code does unless ``pos_interp`` says 'timm' or 'original', refusals), then the
    architecture's checkpoint_filter_fn. Registers added by vitscope (``reg_token``) and a learned normaliser's
    parameters may be absent from the file and keep their initialisation. One line on stderr says what was loaded
    (and, for a file found by name, ``source``: its cache, revision and sha256); the report is also kept as
    ``model.vitscope_load``."""
    convert = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    added = int(getattr(model, "vitscope_added_registers", 0))
    new = {"reg_token"} if added else set()
    new |= {name for name, _ in model.named_parameters() if ".normalizer." in name}  # a learned alpha
    state, report = origins.prepare(read_state_dict(path), model, Path(path), own_registers=_registers(model) - added,
                                    pos_interp=pos_interp)
    if convert is not None:  # an odd position grid fails here: refused with the misfit line
        state = convert_or_refuse(state, model, convert, path, may_lack=new, may_have=origins.known_head,
                                  model_name=origins.model_name(model), fix=origins.fix(report))
    origins.finish(model, state, report, new)
    if source is not None:
        report.source = source.to_dict()
        report.notes.append(source.note())
    model.vitscope_load = report.to_dict()
    origins.announce(report)
    return report


def _registers(model: nn.Module) -> int:
    count = getattr(model, "num_reg_tokens", None)
    if count is None:
        reg_token = getattr(model, "reg_token", None)
        count = 0 if reg_token is None else reg_token.shape[1]
    return int(count or 0)


def resize(model: nn.Module, img_size: int | None) -> nn.Module:
    """Resample the positional embedding to ``img_size`` with timm's ``set_input_size``; models without a fixed
    input size (PVT-v2) take any input as it is; a NaFlexVit takes ``img_size`` as its default input size (its
    ``pretrained_cfg['input_size']``, which sets its layout and the size the pipelines feed it)."""
    if img_size is not None and type(model).__name__ == "NaFlexVit":  # any size: img_size becomes its default input
        check_img_size(img_size, int(model.embeds.patch_size[0]), "NaFlexVit")
        model.pretrained_cfg = {**(getattr(model, "pretrained_cfg", None) or {}), "input_size": (3, img_size, img_size)}
        return model
    fixed_size = getattr(getattr(model, "patch_embed", None), "img_size", None) is not None
    if img_size is not None and fixed_size:
        if not hasattr(model, "set_input_size"):
            raise ValueError(f"{type(model).__name__} cannot change its input size; drop img_size=")
        patch = model.patch_embed.patch_size
        check_img_size(img_size, int(patch[0] if isinstance(patch, tuple | list) else patch), type(model).__name__)
        model.set_input_size(img_size=img_size)
    return model
