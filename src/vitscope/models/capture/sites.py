"""Attention sites: the places in a model where attention can be observed, and what they deliver.

Every site delivers, once per forward pass, a ``Capture``: the layer's token layout, its probabilities in
canonical form (B, heads, Tq, Tk), computed only when asked for, and, for an unmasked softmax attention whose
canonical form is its raw one (plain ViTs, PVT-v2), its queries, keys and scale, from which statistics can be
computed without the probabilities. No site changes its module: outputs are bit-identical with and without
recording, whichever path (fused or manual) the layer takes.

- vitscope's ``Attention``: through its observer.
- timm's ViT ``Attention`` (ViT, DeiT-III, DINO, DINOv2, CLIP; q/k-norm and gated variants): queries and
  keys are read at the outputs of its ``q_norm`` / ``k_norm`` and the mask at its input.
- timm's ``EvaAttention`` and ``AttentionRope`` (EVA-02, DINOv3, the RoPE ViTs): q and k as for timm's Attention,
  rotated as the module rotates them (``models.capture.rope_naflex``); NaFlexVit's per-image layouts from its patch
  coordinates, and the grid of each input for models built with ``dynamic_img_size``.
- timm's Swin and PVT-v2 attention (a relative-position bias and shift mask, or reduced keys): queries and
  keys at the outputs of their projections (``models.capture.hierarchical``).
- adapted models (Hugging Face ``hf:``, OpenCLIP ``open_clip:``): through the adapter's own
  ``attach_attention(index, deliver)``, with the layout of its latest input (``input_layout()``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import Tensor, nn

from vitscope.attention import Attention, AttentionEvent, Softmax
from vitscope.metrics import SoftmaxInputs
from vitscope.models.capture.delivery import Capture, Observer, plain_capture
from vitscope.models.capture.hierarchical import Geometry, hierarchical_geometry
from vitscope.models.capture.layout import TokenLayout
from vitscope.models.capture.padded import split_capture
from vitscope.models.capture.rope_naflex import (
    InputGrid,
    NaFlexTokens,
    attach_rope_attention,
    attention_inputs,
    is_rope_attention,
    naflex_layout,
)


@dataclass(frozen=True)
class PlainLayout:
    """Canonical form for plain ViTs: probabilities are already (B, heads, T, T), with one fixed layout."""

    layout: TokenLayout

    def __call__(self, probs: Tensor) -> tuple[Tensor, TokenLayout]:
        return probs, self.layout

    def capture(self, event: AttentionEvent) -> Capture:
        return plain_capture(event, self.layout)

    def watch(self) -> Callable[[], None]:
        return lambda: None


@dataclass(frozen=True)
class AdapterLayout:
    """The layout of an adapted model (Hugging Face, OpenCLIP): the adapter's ``input_layout()`` of its latest
    input."""

    model: nn.Module

    def capture(self, event: AttentionEvent) -> Capture:
        groups = self.model.input_groups() if hasattr(self.model, "input_groups") else None
        return split_capture(event, groups) if groups else plain_capture(event, self.model.input_layout())

    def watch(self) -> Callable[[], None]:
        return lambda: None


# the token layout of a plain ViT's attention: fixed, or read from each forward pass's input
PlainTokens = PlainLayout | InputGrid | NaFlexTokens | AdapterLayout


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer: its module path, 0-based index, how its probabilities become canonical (and its layout),
    and ``attach(observer) -> detach``."""

    name: str
    index: int
    module: nn.Module
    canonical: PlainTokens | Geometry
    attach_with: Callable[[Callable[[AttentionEvent], None]], Callable[[], None]] | None = None  # an adapter's own

    def attach(self, observer: Observer) -> Callable[[], None]:
        """Hand every forward pass's ``Capture`` to ``observer`` until the returned function is called."""
        if isinstance(self.canonical, PlainTokens):
            tokens = self.canonical
            deliver = lambda event: observer(tokens.capture(event))  # noqa: E731
            stop_watching = tokens.watch()
            try:
                detach = (self.attach_with or partial(_attach_plain, self.module))(deliver)
            except BaseException:
                stop_watching()
                raise

            def detach_all() -> None:
                detach()
                stop_watching()

            return detach_all
        return _attach_hierarchical(self.canonical, observer)


def _attach_plain(module: nn.Module, deliver: Callable[[AttentionEvent], None]) -> Callable[[], None]:
    if isinstance(module, Attention):
        return _attach_vitscope(module, deliver)
    if is_rope_attention(module):
        return attach_rope_attention(module, deliver)
    return _attach_timm_vit(module, deliver)


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
        seen["mask"] = attention_inputs(args, kwargs, 1, 2)

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
    """The token layout of a plain ViT (vitscope's, timm's VisionTransformer, Eva and NaFlexVit families, or an
    adapted model) at its native input size. Registers are prefix tokens after CLS."""
    if type(model).__name__ == "NaFlexVit":
        return naflex_layout(model)
    grid = getattr(model, "grid_size", None) or getattr(getattr(model, "patch_embed", None), "grid_size", None)
    if grid is None:
        raise ValueError(f"{type(model).__name__} exposes no grid_size; load it through vitscope.models.load")
    patch = getattr(model, "patch_size", None) or getattr(model.patch_embed, "patch_size", None)
    patch = patch[0] if isinstance(patch, tuple | list) else patch
    registers = getattr(model, "num_registers", getattr(model, "num_reg_tokens", None))
    if registers is None:  # timm's Eva keeps its registers' count only in the shape of reg_token
        reg_token = getattr(model, "reg_token", None)
        registers = 0 if reg_token is None else reg_token.shape[1]
    return TokenLayout(
        num_prefix_tokens=int(model.num_prefix_tokens),
        grid_size=tuple(grid),
        patch_size=int(patch),
        num_registers=int(registers or 0),
    )


def plain_tokens(model: nn.Module) -> PlainTokens:
    """Where a plain ViT's layout comes from: NaFlexVit's patch coordinates, the grid of each input for a model
    built with ``dynamic_img_size``, else the model's fixed grid."""
    layout = token_layout(model)
    if type(model).__name__ == "NaFlexVit":
        return NaFlexTokens(model.embeds, layout)
    if getattr(model, "dynamic_img_size", False) and hasattr(model, "patch_embed"):
        return InputGrid(model.patch_embed, layout)
    return PlainLayout(layout)


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Every attention layer of ``model`` in block order."""
    if hasattr(model, "attach_attention") and hasattr(model, "input_layout"):  # an adapter captures its attention
        canonical = AdapterLayout(model)
        return [AttentionSite(f"blocks.{i}.attn", i, module, canonical, partial(model.attach_attention, i))
                for i, module in enumerate(model.attention_modules)]
    if hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens"):
        canonical = plain_tokens(model)
        for i, block in enumerate(model.blocks):
            attn = getattr(block, "attn", None)
            if not (isinstance(attn, Attention) or is_timm_vit_attention(attn) or is_rope_attention(attn)):
                kind = type(attn).__name__ if attn is not None else f"{type(block).__name__} (no attn module)"
                raise ValueError(f"cannot record attention of block {i}: {kind} is not an attention vitscope knows "
                                 "(timm's Attention, with or without q/k-norm or gate, EvaAttention, AttentionRope, "
                                 "or vitscope's)")
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
