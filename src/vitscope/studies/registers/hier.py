"""Per-stage attention mass on high-norm tokens of hierarchical timm models (Swin, PVT-v2), on their own geometry.

Attention layer l (block l, numbered from 1 across stages) reads its block's input tokens: the previous block's
output, or for a stage's first block the stage's merged input. Those input tokens are high-norm when their norm
exceeds the stage's threshold (fixed on the stage's last block). The mass and the share are computed over the
keys each query can see (``vitscope.metrics.visible_keys``): a Swin query's visible window keys; PVT-v2's
reduced key grid, where a reduced key is high-norm when its cell holds a high-norm token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from vitscope.metrics.visible_keys import (
    reduced_high_keys,
    reduced_mass_on_high_norm,
    swin_window_keys,
    window_mass_on_high_norm,
)
from vitscope.models.capture.sites import token_blocks
from vitscope.record import record_attention


def _swin_mass(block: nn.Module, grid: tuple[int, int], probs: Tensor, high: Tensor) -> dict[str, Tensor]:
    mask = getattr(block, "attn_mask", None)
    if mask is None and any(block.shift_size):  # timm's dynamic-mask variant builds it at forward time
        mask = block.get_attn_mask()
    keys = swin_window_keys(grid, tuple(block.window_size), tuple(block.shift_size), mask)
    return window_mass_on_high_norm(probs, keys, high)


def _pvt_mass(block: nn.Module, grid: tuple[int, int], probs: Tensor, high: Tensor) -> dict[str, Tensor]:
    attn = block.attn
    if getattr(attn, "pool", None) is not None:
        size = attn.pool.output_size
        key_high = reduced_high_keys(high, grid, (size, size) if isinstance(size, int) else tuple(size), pooled=True)
    elif getattr(attn, "sr", None) is not None:
        key_high = reduced_high_keys(high, grid, int(attn.sr.stride[0]))
    else:
        key_high = reduced_high_keys(high, grid, None)
    return reduced_mass_on_high_norm(probs, key_high)


@torch.no_grad()
def block_inputs(model: nn.Module, images: Tensor) -> tuple[list[Tensor], list[tuple[int, int]], list[Tensor]]:
    """One forward pass of ``images`` recording every block's input token norms (B, N), its grid (rows, cols) and
    its canonical attention maps (B, heads, Q, K) through ``vitscope.record_attention``."""
    blocks = token_blocks(model)
    norms: list[Tensor | None] = [None] * len(blocks)
    grids: list[tuple[int, int] | None] = [None] * len(blocks)

    def hook(index: int):
        def pre(_module: nn.Module, args: tuple) -> None:
            x = args[0].detach()
            if x.ndim == 4:  # Swin: (B, H, W, C)
                grids[index] = (x.shape[1], x.shape[2])
            else:  # PVT-v2: (B, N, C) with feat_size beside it
                grids[index] = tuple(int(v) for v in args[1])
            norms[index] = x.float().flatten(1, -2).norm(dim=-1).cpu()
        return pre

    handles = [block.register_forward_pre_hook(hook(i)) for i, (_, block) in enumerate(blocks)]
    try:
        with record_attention(model, keep="maps") as rec:
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return norms, grids, [m.float().cpu() for m in rec.maps]


def hierarchical_attention_rows(model: nn.Module, images: Tensor, stage_of: list[int],
                                thresholds: dict[int, Any], label: str) -> list[dict[str, Any]]:
    """Rows of attention mass on high-norm keys (``patch-query``) and their share of visible keys (``high-norm``),
    per attention layer; ``stage_of`` the 0-based stage of each block; ``thresholds`` stage -> its primary
    ``Threshold``."""
    blocks = token_blocks(model)
    swin = type(model).__name__ == "SwinTransformer"
    norms, grids, maps = block_inputs(model, images)
    rows = []
    for index, ((_, block), probs) in enumerate(zip(blocks, maps, strict=True)):
        stage = stage_of[index]
        threshold = thresholds[stage]
        high = norms[index] > threshold.value
        mass = (_swin_mass if swin else _pvt_mass)(block, grids[index], probs, high)
        extra = {"layer_kind": "attention", "stage": stage + 1, "threshold": threshold.spec,
                 "threshold_value": threshold.value, "keys": "window" if swin else "reduced grid"}
        common = {"model": label, "layer": index + 1, "n": len(images), **extra}
        rows.append({**common, "group": "patch-query", "metric": "attention_mass_on_high_norm",
                     "value": float(mass["patch"].mean())})
        rows.append({**common, "group": "high-norm", "metric": "key_share", "value": float(mass["share"].mean())})
    return rows
