"""Full-resolution dense predictions in tiles of label rows: memory flat in the label size.

A head's low-resolution logits (C, rows, cols) are upsampled bilinearly (``align_corners=False``, the source
position (i + 0.5) * in / out - 0.5 clamped to the border, as ``F.interpolate``) separably: along the columns
once, (C, rows, W), then each tile of label rows from the two source rows of each output row. Every output value
is computed by the same elementwise arithmetic whatever the tile (the depth's sums over bins too, in one fixed
order: ``fixed_order_sum``), so a tiled prediction equals the untiled one exactly. Segmentation takes the
argmax over classes per tile; depth the bin centres weighted by DINOv2's linear normalisation
(``probes.bin_norm``) per tile, so the (bins, H, W) volume is never held.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from vitscope.probes.dense.bin_norm import raw_bin_weights

TILE_VALUES = 1 << 22  # logits per tile (16 MB of float32): ``tile rows = TILE_VALUES // (C * W)``


def source_index(out_size: int, in_size: int, device: torch.device | str = "cpu"
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For each of ``out_size`` outputs: the two source indices (int64) and their weights (float32)."""
    scale = in_size / out_size
    position = ((torch.arange(out_size, device=device, dtype=torch.float32) + 0.5) * scale - 0.5).clamp(min=0)
    low = position.floor().long().clamp(max=in_size - 1)
    high = (low + 1).clamp(max=in_size - 1)
    frac = position - low.float()
    return low, high, 1 - frac, frac


def upsample_columns(logits: Tensor, width: int) -> Tensor:
    """(C, rows, cols) -> (C, rows, width), bilinear along the columns."""
    low, high, w_low, w_high = source_index(width, logits.shape[-1], logits.device)
    return logits[..., low] * w_low + logits[..., high] * w_high


def upsample_rows(columns: Tensor, height: int, start: int, stop: int) -> Tensor:
    """Label rows ``start:stop`` of the (C, height, W) upsampling, from ``upsample_columns``' (C, rows, W)."""
    low, high, w_low, w_high = (t[start:stop] for t in source_index(height, columns.shape[-2], columns.device))
    return columns[:, low] * w_low[:, None] + columns[:, high] * w_high[:, None]


def tile_rows(channels: int, width: int, tile_values: int = TILE_VALUES) -> int:
    return max(1, tile_values // max(1, channels * width))


def iter_tiles(logits: Tensor, size: tuple[int, int], tile_values: int = TILE_VALUES
               ) -> Iterator[tuple[int, Tensor]]:
    """(row offset, (C, t, W) upsampled logits) for consecutive tiles of ``size`` = (H, W) label rows."""
    height, width = size
    columns = upsample_columns(logits, width)
    step = tile_rows(logits.shape[0], width, tile_values)
    for start in range(0, height, step):
        yield start, upsample_rows(columns, height, start, min(height, start + step))


def fixed_order_sum(values: Tensor, inplace: bool = False) -> Tensor:
    """Sum over dim 0 by one fixed pairwise tree (zero-padded to a power of two): each output element gets the same
    float arithmetic whatever the sizes of the other dims. A BLAS product does not promise that: MKL's sgemm sums
    a (2, 256) x (256, N) product in an order that depends on N, so the same pixel differed by a few float32 ulps
    (up to 1.1e-6 relative) between a 1-row and a 7-row tile, with 1 thread or 2. ``inplace``: ``values`` may be
    overwritten (no copy)."""
    size = 1 << max(0, (values.shape[0] - 1).bit_length())
    if size != values.shape[0]:
        values = torch.cat([values, values.new_zeros(size - values.shape[0], *values.shape[1:])])
    elif not inplace:
        values = values.clone()  # summed in place below
    while values.shape[0] > 1:
        half = values.shape[0] // 2
        values = values[:half].add_(values[half:])
    return values[0]


def depth_of_tile(tile: Tensor, bins: Tensor) -> Tensor:
    """(bins, t, W) logits -> (t, W) depth: ``bins`` weighted by ``probes.bin_norm``'s default (DINOv2's linear),
    both sums over the bins in ``fixed_order_sum``'s order, so that every tile computes a pixel the same way."""
    weights = raw_bin_weights(tile.reshape(tile.shape[0], -1), dim=0)
    weighted = weights * bins[:, None]
    depth = fixed_order_sum(weighted, inplace=True) / fixed_order_sum(weights, inplace=True)
    return depth.reshape(tile.shape[1:])


@torch.no_grad()
def predict_full(logits: Tensor, size: tuple[int, int], task: str, bins: Tensor | None = None,
                 tile_values: int = TILE_VALUES) -> Tensor:
    """One image's (C, rows, cols) logits -> (H, W) class map (int64) or depth (float32), tile by tile."""
    out = torch.empty(size, dtype=torch.long if task == "segmentation" else torch.float32, device=logits.device)
    for start, tile in iter_tiles(logits.float(), size, tile_values):
        out[start : start + tile.shape[1]] = tile.argmax(0) if task == "segmentation" else depth_of_tile(tile, bins)
    return out
