"""Input sizes of a vitscope VisionTransformer: checking a size, and fitting a learned position table to a grid.

The learned positional embedding (CLS entry kept, patch grid resampled bicubically) goes through timm's
``resample_abs_pos_embed``, as timm does for its own ViTs; a sine-cosine table is rebuilt for the new grid.
"""

from __future__ import annotations

import math

from timm.layers import resample_abs_pos_embed
from torch import Tensor

from vitscope.models.own.vit import VisionTransformer

MAX_PATCH_TOKENS = 16_384  # a 128 x 128 patch grid (2048 px at patch 16): one attention map is 1 GiB in float32


def check_img_size(img_size: object, patch_size: int, what: str) -> int:
    """``img_size`` as a positive multiple of ``patch_size``, else a ValueError naming both and the fix."""
    if isinstance(img_size, bool) or not isinstance(img_size, int) or img_size < 1:
        raise ValueError(f"img_size={img_size!r} must be a positive integer number of pixels")
    if img_size % patch_size:
        below = max(patch_size, img_size // patch_size * patch_size)
        raise ValueError(f"img_size={img_size} is not a multiple of {what}'s patch size {patch_size}; "
                         f"use a multiple such as {below} or {below + patch_size}")
    if (img_size // patch_size) ** 2 > MAX_PATCH_TOKENS:
        largest = int(MAX_PATCH_TOKENS**0.5) * patch_size
        raise ValueError(f"img_size={img_size} gives {(img_size // patch_size) ** 2:,} patch tokens at {what}'s patch "
                         f"size {patch_size}, above the bound of {MAX_PATCH_TOKENS:,}; use at most {largest} pixels")
    return img_size


def fit_position_table(table: Tensor, model: VisionTransformer) -> Tensor:
    """A learned position table (1, prefix + M*M, D) of a square M x M grid resampled to ``model``'s grid (its CLS
    entry kept); ``table`` itself when it already fits."""
    prefix = int(model.cfg.class_token)
    side = math.isqrt(table.shape[1] - prefix)
    old_grid = [side, side]
    if old_grid == list(model.grid_size):
        return table
    return resample_abs_pos_embed(table, list(model.grid_size), old_grid, num_prefix_tokens=prefix)


def resize_input(model: VisionTransformer, img_size: int) -> VisionTransformer:
    """A copy of ``model`` for ``img_size`` x ``img_size`` inputs (same weights, positional embedding resampled);
    ``model`` itself when the size is unchanged."""
    cfg = model.cfg
    check_img_size(img_size, cfg.patch_size, "the model")
    if img_size == cfg.img_size:
        return model
    resized = VisionTransformer(cfg.replace(img_size=img_size))
    state = model.state_dict()
    if "pos_embed" in state:  # learned table; a sine-cosine one is a non-persistent buffer rebuilt above
        state["pos_embed"] = fit_position_table(state["pos_embed"], resized)
    resized.load_state_dict(state)
    return resized.train(model.training)
