"""Attention sites: the places in a model where attention probabilities can be observed.

vitscope's own ``Attention`` hands its probabilities to an observer directly. timm's attention modules
(ViT, DeiT-III, DINO, DINOv2, CLIP, Swin, PVT-v2) are switched to their manual path for the duration
(``fused_attn = False``) and read at the input of their ``attn_drop``, which is where that path's
probabilities are; every attribute changed is restored on detach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from vitscope.attention import Attention
from vitscope.models.layout import TokenLayout

# An observer receives one forward pass's probabilities in canonical form (B, heads, Tq, Tk) and the
# layout that says which rows and columns are which tokens.
ProbsObserver = Callable[[Tensor, TokenLayout], None]
# Receives scaled queries and keys (B, heads, T, head_dim) of a softmax attention, its mask, and its layout.
SoftmaxObserver = Callable[[Tensor, Tensor, Tensor | None, TokenLayout], None]
# Turns a module's raw probabilities into canonical form and gives their layout.
Canonical = Callable[[Tensor], tuple[Tensor, TokenLayout]]


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer: its module path, 0-based index, and ``attach(observer) -> detach``."""

    name: str
    index: int
    module: nn.Module
    canonical: Canonical

    def attach(self, observer: ProbsObserver) -> Callable[[], None]:
        def deliver(probs: Tensor) -> None:
            observer(*self.canonical(probs))

        if isinstance(self.module, Attention):
            detach = _attach_vitscope(self.module, deliver)
        else:
            detach = _attach_timm(self.module, deliver)
        install = getattr(self.canonical, "install", None)  # geometry read at forward time (PVT)
        uninstall = install() if install is not None else (lambda: None)

        def undo() -> None:
            detach()
            uninstall()

        return undo

    def attach_streaming(self, observer: ProbsObserver, softmax_observer: SoftmaxObserver) -> Callable[[], None]:
        """Like ``attach``, but a vitscope softmax attention keeps its fused path and hands its scaled
        queries and keys to ``softmax_observer``, which recomputes softmax(q k^T) only for itself."""
        module = self.module
        if not (isinstance(module, Attention) and module.normalizer.is_softmax and module.fused
                and isinstance(self.canonical, PlainLayout)):
            return self.attach(observer)
        previous = module.probe
        layout = self.canonical.layout

        def probe(scaled_q: Tensor, k: Tensor, attn_mask: Tensor | None) -> None:
            softmax_observer(scaled_q, k, attn_mask, layout)

        module.probe = probe

        def undo() -> None:
            module.probe = previous

        return undo


def _attach_vitscope(module: Attention, deliver: Callable[[Tensor], None]) -> Callable[[], None]:
    previous = module.observer
    module.observer = lambda _module, probs: deliver(probs)

    def detach() -> None:
        module.observer = previous

    return detach


def _attach_timm(module: nn.Module, deliver: Callable[[Tensor], None]) -> Callable[[], None]:
    if not hasattr(module, "attn_drop") or not hasattr(module, "fused_attn"):
        raise ValueError(f"{type(module).__name__} has no manual attention path to record; vitscope supports "
                         "timm's ViT, DeiT, DINO, DINOv2, CLIP, Swin and PVT-v2 attention")
    previous = module.fused_attn
    module.fused_attn = False
    handle = module.attn_drop.register_forward_hook(lambda _m, inputs, _out: deliver(inputs[0]))

    def detach() -> None:
        handle.remove()
        module.fused_attn = previous

    return detach


@dataclass(frozen=True)
class PlainLayout:
    """Canonical form for plain ViTs: probabilities are already (B, heads, T, T), with one fixed layout."""

    layout: TokenLayout

    def __call__(self, probs: Tensor) -> tuple[Tensor, TokenLayout]:
        return probs, self.layout


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
    from vitscope.models.hierarchical import hierarchical_sites

    if hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens"):
        canonical = PlainLayout(token_layout(model))
        return [AttentionSite(f"blocks.{i}.attn", i, block.attn, canonical) for i, block in enumerate(model.blocks)]
    sites = hierarchical_sites(model)
    if sites is not None:
        return sites
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
