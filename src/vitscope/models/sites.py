"""Attention sites: the places in a model where attention probabilities can be observed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from vitscope.models.layout import TokenLayout
from vitscope.models.vit import VisionTransformer

# An observer receives the attention probabilities (B, heads, Tq, Tk) of one forward pass.
ProbsObserver = Callable[[Tensor], None]


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer: its module path, 0-based index, token layout and a way to observe it.

    ``attach(observer)`` starts delivering probabilities to ``observer`` and returns a function that
    undoes exactly what it changed.
    """

    name: str
    index: int
    layout: TokenLayout
    attach: Callable[[ProbsObserver], Callable[[], None]]


def _vitscope_attach(module: nn.Module) -> Callable[[ProbsObserver], Callable[[], None]]:
    def attach(observer: ProbsObserver) -> Callable[[], None]:
        previous = module.observer
        module.observer = lambda _module, probs: observer(probs)

        def detach() -> None:
            module.observer = previous

        return detach

    return attach


def token_layout(model: nn.Module) -> TokenLayout:
    """The token layout of a plain ViT (vitscope's, or any with the timm contract)."""
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
    if isinstance(model, VisionTransformer):
        layout = token_layout(model)
        return [
            AttentionSite(f"blocks.{i}.attn", i, layout, _vitscope_attach(block.attn))
            for i, block in enumerate(model.blocks)
        ]
    raise ValueError(
        f"cannot record attention from a {type(model).__name__}; build it with vitscope.models.create "
        "or load it with vitscope.models.load('timm:NAME')"
    )
