"""Attention sites: the places in a model where attention can be observed, and what they deliver.

Every site delivers, once per forward pass, a ``Capture``: the layer's token layout, its probabilities in
canonical form (B, heads, Tq, Tk), computed only when asked for, and, for an unmasked softmax attention whose
canonical form is its raw one (plain ViTs, PVT-v2), its queries, keys and scale, from which statistics can be
computed without the probabilities. No site changes its module: outputs are bit-identical with and without
recording, whichever path (fused or manual) the layer takes.

- vitscope's ``Attention``: through its observer.
- timm's ViT ``Attention`` (ViT, DeiT-III, DINO, DINOv2, CLIP; q/k-norm and gated variants): queries and
  keys are read at the outputs of its ``q_norm`` / ``k_norm`` and the mask at its input.
- timm's Swin and PVT-v2 attention (a relative-position bias and shift mask, or reduced keys): queries and
  keys at the outputs of their projections (``models.hierarchical``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitscope.attention import Attention, AttentionEvent, Softmax
from vitscope.metrics import SoftmaxInputs
from vitscope.models.hierarchical import Geometry, hierarchical_geometry
from vitscope.models.layout import TokenLayout


@dataclass
class Capture:
    """One layer's attention on one batch: ``layout``, ``probs()`` (B, heads, Tq, Tk) in canonical form, and
    ``softmax_qk`` (``SoftmaxInputs``) for an unmasked softmax whose canonical form is its raw one, else None."""

    layout: TokenLayout
    probs: Callable[[], Tensor]
    softmax_qk: SoftmaxInputs | None = None


Observer = Callable[[Capture], None]


@dataclass(frozen=True)
class PlainLayout:
    """Canonical form for plain ViTs: probabilities are already (B, heads, T, T), with one fixed layout."""

    layout: TokenLayout

    def __call__(self, probs: Tensor) -> tuple[Tensor, TokenLayout]:
        return probs, self.layout


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer: its module path, 0-based index, how its probabilities become canonical (and its layout),
    and ``attach(observer) -> detach``."""

    name: str
    index: int
    module: nn.Module
    canonical: PlainLayout | Geometry

    def attach(self, observer: Observer) -> Callable[[], None]:
        """Hand every forward pass's ``Capture`` to ``observer`` until the returned function is called."""
        if isinstance(self.canonical, PlainLayout):
            layout = self.canonical.layout
            deliver = lambda event: observer(_plain_capture(event, layout))  # noqa: E731
            if isinstance(self.module, Attention):
                return _attach_vitscope(self.module, deliver)
            return _attach_timm_vit(self.module, deliver)
        return _attach_hierarchical(self.canonical, observer)


def _plain_capture(event: AttentionEvent, layout: TokenLayout) -> Capture:
    qk = SoftmaxInputs(event.q, event.k, event.scale) if event.is_softmax and event.attn_mask is None else None
    return Capture(layout, lambda: event.probs, qk)


def _attach_vitscope(module: Attention, deliver: Callable[[AttentionEvent], None]) -> Callable[[], None]:
    previous = module.observer
    module.observer = deliver

    def detach() -> None:
        module.observer = previous

    return detach


def is_timm_vit_attention(module: nn.Module | None) -> bool:
    """timm's ViT ``Attention`` (or a subclass that keeps its forward, e.g. one built with ``gated=True``)."""
    from timm.layers.attention import Attention as TimmAttention

    return isinstance(module, TimmAttention) and type(module).forward is TimmAttention.forward


def _attach_timm_vit(module: nn.Module, deliver: Callable[[AttentionEvent], None]) -> Callable[[], None]:
    """q and k at the outputs of q_norm / k_norm, the mask at the module's input; the fused path stays on."""
    softmax = Softmax()
    seen: dict[str, Tensor | None] = {}

    def inputs(_m, args, kwargs) -> None:
        mask = kwargs.get("attn_mask", args[1] if len(args) > 1 else None)
        causal = kwargs.get("is_causal", args[2] if len(args) > 2 else False)
        if causal:
            n = args[0].shape[1]
            tril = torch.ones(n, n, dtype=torch.bool, device=args[0].device).tril()
            mask = tril if mask is None else (mask & tril if mask.dtype == torch.bool
                                              else mask.masked_fill(~tril, float("-inf")))
        seen["mask"] = mask

    def query(_m, _inputs, q: Tensor) -> None:
        seen["q"] = q

    def key(_m, _inputs, k: Tensor) -> None:
        deliver(AttentionEvent(seen.pop("q"), k, module.scale, seen.get("mask"), softmax))

    handles = [module.register_forward_pre_hook(inputs, with_kwargs=True),
               module.q_norm.register_forward_hook(query), module.k_norm.register_forward_hook(key)]

    def detach() -> None:
        for handle in handles:
            handle.remove()

    return detach


def _attach_hierarchical(geometry: Geometry, observer: Observer) -> Callable[[], None]:
    """Swin and PVT-v2: q and k from the layer's projections (``Geometry.attach``), probabilities recomputed as
    timm's manual path does, once, when first asked for."""

    def deliver(raw: Callable[[], Tensor], softmax: SoftmaxInputs | None) -> None:
        kept: list[Tensor] = []

        def probs() -> Tensor:
            if not kept:
                kept.append(geometry(raw())[0])
            return kept[0]

        observer(Capture(geometry.layout, probs, softmax))

    return geometry.attach(deliver)


def token_layout(model: nn.Module) -> TokenLayout:
    """The token layout of a plain ViT (vitscope's, or timm's VisionTransformer family)."""
    grid = getattr(model, "grid_size", None) or getattr(getattr(model, "patch_embed", None), "grid_size", None)
    if grid is None:
        raise ValueError(f"{type(model).__name__} exposes no grid_size; load it through vitscope.models.load")
    patch = getattr(model, "patch_size", None) or getattr(model.patch_embed, "patch_size", None)
    patch = patch[0] if isinstance(patch, tuple | list) else patch
    return TokenLayout(
        num_prefix_tokens=int(model.num_prefix_tokens),
        grid_size=tuple(grid),
        patch_size=int(patch),
        num_registers=int(getattr(model, "num_registers", getattr(model, "num_reg_tokens", 0)) or 0),
    )


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Every attention layer of ``model`` in block order."""
    if hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens"):
        canonical = PlainLayout(token_layout(model))
        for i, block in enumerate(model.blocks):
            attn = getattr(block, "attn", None)
            if not (isinstance(attn, Attention) or is_timm_vit_attention(attn)):
                kind = type(attn).__name__ if attn is not None else f"{type(block).__name__} (no attn module)"
                raise ValueError(f"cannot record attention of block {i}: {kind} is not an attention vitscope knows "
                                 "(timm's Attention, with or without q/k-norm or gate, or vitscope's)")
        return [AttentionSite(f"blocks.{i}.attn", i, block.attn, canonical) for i, block in enumerate(model.blocks)]
    found = hierarchical_geometry(model)
    if found is not None:
        return [AttentionSite(name, i, module, geometry) for i, (name, module, geometry) in enumerate(found)]
    raise ValueError(
        f"cannot record attention from a {type(model).__name__}; build it with vitscope.models.create "
        "or load it with vitscope.models.load('timm:NAME')"
    )


def token_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The transformer blocks whose outputs are the model's tokens, in order (plain ViTs, Swin, PVT-v2)."""
    if hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens"):
        return [(f"blocks.{i}", block) for i, block in enumerate(model.blocks)]
    stages = getattr(model, "layers", None) or getattr(model, "stages", None)
    if stages is not None and all(hasattr(stage, "blocks") for stage in stages):
        prefix = "layers" if hasattr(model, "layers") else "stages"
        return [(f"{prefix}.{s}.blocks.{b}", block) for s, stage in enumerate(stages)
                for b, block in enumerate(stage.blocks)]
    raise ValueError(f"cannot record tokens from a {type(model).__name__}; load it with vitscope.models.load")
