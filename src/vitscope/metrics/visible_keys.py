"""Attention mass on high-norm tokens in hierarchical models, over the keys each query can see (pure tensors).

Definitions (docs/definitions.md, high-norm tokens in hierarchical models):

* **Swin** (window attention): a query sees the keys of its own window (cyclic shift undone), minus padding and
  minus the keys the shifted-window mask hides (timm's ``attn_mask`` of -100: another region of the rolled
  image). The mass is the sum of the query's probabilities over the visible high-norm keys; the *share* is the
  fraction of its visible keys that are high-norm (what uniform attention over what it can see would give).
  Both are averaged over heads and queries per image.
* **PVT-v2** (spatial-reduction attention): keys are pooled cells of the stage grid (a strided convolution of
  ``r x r`` cells, or the adaptive 7x7 average pool of the linear variant). Mass is measured **on the reduced
  key grid**: a reduced key counts as high-norm when its cell holds at least one high-norm token (a max-pool
  of the high-norm map over the same cells); the share is the fraction of reduced keys that are high-norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class WindowKeys:
    """Per canonical query row (windows x window area, padded queries dropped, in window order): ``query``
    (Q,) its token index on the stage grid (row-major), ``keys`` (Q, K) the token index of each key of its window
    (-1 for padding) and ``visible`` (Q, K) whether the query can see that key."""

    query: Tensor
    keys: Tensor
    visible: Tensor


def swin_window_keys(resolution: tuple[int, int], window: tuple[int, int], shift: tuple[int, int],
                     shift_mask: Tensor | None = None) -> WindowKeys:
    """Window geometry of one Swin block on an ``resolution`` (rows, cols) grid: the rolled image (by -shift) is
    padded to whole windows and cut into ``window`` windows, row-major; ``shift_mask`` (windows, K, K) is timm's
    additive ``attn_mask`` (0 visible, negative hidden), or None for unshifted blocks."""
    (h, w), (wh, ww), (sh, sw) = resolution, window, shift
    hp, wp = math.ceil(h / wh) * wh, math.ceil(w / ww) * ww
    win_r, win_c, loc_r, loc_c = torch.meshgrid(torch.arange(hp // wh), torch.arange(wp // ww), torch.arange(wh),
                                                torch.arange(ww), indexing="ij")
    rows, cols = (win_r * wh + loc_r).reshape(-1), (win_c * ww + loc_c).reshape(-1)  # rolled, padded frame
    real = (rows < h) & (cols < w)
    token = torch.where(real, ((rows + sh) % h) * w + (cols + sw) % w, torch.full_like(rows, -1))
    windows, area = (hp // wh) * (wp // ww), wh * ww
    keys = token.view(windows, 1, area).expand(windows, area, area)
    visible = (keys >= 0).clone()
    if shift_mask is not None:
        if tuple(shift_mask.shape) != (windows, area, area):
            raise ValueError(f"shift mask {tuple(shift_mask.shape)} does not match {windows} windows of {area} "
                             "tokens")
        visible &= shift_mask.cpu() == 0
    rows_kept = real.nonzero().squeeze(1)
    return WindowKeys(token[rows_kept], keys.reshape(-1, area)[rows_kept], visible.reshape(-1, area)[rows_kept])


def window_mass_on_high_norm(probs: Tensor, keys: WindowKeys, high: Tensor) -> dict[str, Tensor]:
    """Per image (B,): ``patch`` the mass queries put on visible high-norm keys (mean over heads and queries) and
    ``share`` the high-norm fraction of their visible keys (mean over queries). ``probs`` (B, heads, Q, K) in
    canonical window order; ``high`` (B, N) the high-norm tokens of the stage grid."""
    if probs.shape[2:] != keys.keys.shape:
        raise ValueError(f"attention rows {tuple(probs.shape[2:])} do not match the window geometry "
                         f"{tuple(keys.keys.shape)}")
    key_high = high.bool()[:, keys.keys.clamp(min=0)] & keys.visible  # (B, Q, K)
    mass = (probs.float() * key_high[:, None].float()).sum(dim=-1)  # (B, heads, Q)
    share = key_high.float().sum(dim=-1) / keys.visible.float().sum(dim=-1).clamp(min=1)
    return {"patch": mass.mean(dim=(1, 2)), "share": share.mean(dim=1)}


def reduced_high_keys(high: Tensor, grid: tuple[int, int], reduction: int | tuple[int, int] | None,
                      pooled: bool = False) -> Tensor:
    """(B, K) reduced keys that hold at least one high-norm token: ``high`` (B, N) on a ``grid``; ``reduction``
    the strided convolution's ratio r (``pooled=False``) or the adaptive pool's output size (``pooled=True``);
    None keeps every token as a key."""
    b = high.shape[0]
    if high.shape[1] != grid[0] * grid[1]:
        raise ValueError(f"{high.shape[1]} tokens do not fill a {grid[0]}x{grid[1]} grid")
    if reduction is None:
        return high.bool()
    cells = high.float().view(b, 1, *grid)
    if pooled:
        out = F.adaptive_max_pool2d(cells, reduction)
    else:
        out = F.max_pool2d(cells, kernel_size=reduction, stride=reduction)
    return out.flatten(1) > 0


def reduced_mass_on_high_norm(probs: Tensor, key_high: Tensor) -> dict[str, Tensor]:
    """Per image (B,): mass on the high-norm reduced keys (mean over heads and queries) and their share of keys;
    ``probs`` (B, heads, N, K), ``key_high`` (B, K)."""
    if key_high.shape != (probs.shape[0], probs.shape[-1]):
        raise ValueError(f"reduced key set {tuple(key_high.shape)} must be (batch, keys) = "
                         f"{(probs.shape[0], probs.shape[-1])}")
    mass = (probs.float() * key_high[:, None, None].float()).sum(dim=-1)
    return {"patch": mass.mean(dim=(1, 2)), "share": key_high.float().mean(dim=1)}
