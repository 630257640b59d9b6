"""Point-sampled dense losses: the head's bilinear upsampling evaluated only at K sampled label pixels per image.

As Mask2Former and PointRend train their masks: each step draws K pixels of each image uniformly (with
replacement) from its valid pixels (segmentation: not the ignore index; depth: the scores' own mask,
``vitscope.metrics.dense.depth_valid``: finite and in (``min_depth``, ``max_depth``]), reads the
low-resolution logits there by exact bilinear interpolation (``grid_sample`` at the pixel centres with
``align_corners=False`` and border padding, which is what ``F.interpolate(..., mode="bilinear",
align_corners=False)`` computes at those pixels), and weights each image by its share of the batch's valid pixels.

The full-resolution loss of a batch averages over all its valid pixels; with weights w_i = n_i / sum_j n_j
(n_i valid pixels of image i) the estimate sum_i w_i mean_k loss(i, k) is unbiased for cross-entropy. For the
scale-invariant log loss sqrt(E g^2 - lambda (E g)^2), the two moments are estimated without bias and the loss is
a smooth function of them (its bias is of order 1 / (K x images per batch)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vitscope.metrics.dense import depth_valid
from vitscope.probes.dense.bin_norm import bin_weights

SILOG_LAMBDA = 0.85
_REJECTION_BELOW = 0.05  # valid fraction under which points are drawn from the list of valid pixels instead


def valid_pixels(target: Tensor, task: str, ignore_index: int | None,
                 depth_range: tuple[float, float] = (1e-3, 10.0)) -> Tensor:
    """(H, W) bool: the pixels a loss or a score counts (depth: ``depth_valid`` over ``depth_range`` in metres,
    the mask the scores use)."""
    if task == "segmentation":
        return torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    return depth_valid(target, *depth_range)


@dataclass
class PointBatch:
    """K sampled pixels of each of B images: ``grid`` (B, 1, K, 2) grid_sample coordinates (x, y) in [-1, 1],
    ``values`` (B, K) the labels there, ``weights`` (B,) each image's share of the batch's valid pixels, ``rows``
    and ``cols`` (B, K) the pixels and ``sizes`` each image's label (H, W)."""

    grid: Tensor
    values: Tensor
    weights: Tensor
    rows: Tensor
    cols: Tensor
    sizes: list[tuple[int, int]]

    def corners(self, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """The 4 source cells of each point on a (rows, cols) logit grid, as flat indices into the batch's
        (B * rows * cols) cells, (B * K, 4), and their bilinear weights (B * K, 4) (``tiles.source_index``'s
        arithmetic, the upsampling of ``F.interpolate`` with ``align_corners=False``)."""
        r0, r1, fr = _source(self.rows, [h for h, _ in self.sizes], grid[0])
        c0, c1, fc = _source(self.cols, [w for _, w in self.sizes], grid[1])
        base = (torch.arange(len(self.sizes)) * (grid[0] * grid[1]))[:, None, None]
        index = torch.stack([r0 * grid[1] + c0, r0 * grid[1] + c1, r1 * grid[1] + c0, r1 * grid[1] + c1], -1) + base
        weight = torch.stack([(1 - fr) * (1 - fc), (1 - fr) * fc, fr * (1 - fc), fr * fc], -1)
        return index.reshape(-1, 4), weight.reshape(-1, 4)


def _source(pixels: Tensor, out_sizes: list[int], in_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """(B, K) label pixels of images with ``out_sizes`` (B,) -> their two source cells and the second's weight."""
    scale = torch.tensor([in_size / out for out in out_sizes], dtype=torch.float32)[:, None]  # as a float scalar
    position = ((pixels.float() + 0.5) * scale - 0.5).clamp(min=0)
    low = position.floor().long().clamp(max=in_size - 1)
    return low, (low + 1).clamp(max=in_size - 1), position - low.float()


class PointSampler:
    """Draws ``points`` valid pixels per image of ``targets`` (H_i, W_i), uniformly, by rejection from uniform
    pixel draws (exact; the list of valid pixels when few are valid); depth pixels are valid in ``depth_range``
    (``valid_pixels``)."""

    def __init__(self, targets: Sequence[Tensor], task: str, ignore_index: int | None, points: int,
                 generator: torch.Generator, depth_range: tuple[float, float] = (1e-3, 10.0)):
        self.targets, self.task, self.ignore_index, self.points = targets, task, ignore_index, points
        self.generator, self.depth_range = generator, tuple(depth_range)
        self.counts = [int(self._valid(t).sum()) for t in targets]

    def _valid(self, target: Tensor) -> Tensor:
        return valid_pixels(target, self.task, self.ignore_index, self.depth_range)

    def _draw(self, index: int) -> Tensor:
        """(points,) flat pixel indices of image ``index``, uniform over its valid pixels."""
        target = self.targets[index]
        total, valid = target.numel(), self.counts[index]
        if valid == total:
            return torch.randint(0, total, (self.points,), generator=self.generator)
        if valid == 0:
            return torch.zeros(self.points, dtype=torch.long)
        flat = target.reshape(-1)
        if valid < _REJECTION_BELOW * total:
            where = self._valid(flat).nonzero()[:, 0]
            return where[torch.randint(0, valid, (self.points,), generator=self.generator)]
        kept: list[Tensor] = []
        have = 0
        while have < self.points:  # each draw is uniform over all pixels; the valid ones are uniform over those
            draw = torch.randint(0, total, (int(1.2 * self.points * total / valid) + 16,), generator=self.generator)
            draw = draw[self._valid(flat[draw])]
            kept.append(draw)
            have += len(draw)
        return torch.cat(kept)[: self.points]

    def batch(self, indices: Sequence[int]) -> PointBatch:
        flat = torch.stack([self._draw(index) for index in indices])  # (B, K)
        sizes = [tuple(self.targets[index].shape[-2:]) for index in indices]
        heights = torch.tensor([h for h, _ in sizes])[:, None]
        widths = torch.tensor([w for _, w in sizes])[:, None]
        rows, cols = flat // widths, flat % widths
        grid = torch.stack([(2 * cols + 1) / widths - 1, (2 * rows + 1) / heights - 1], dim=-1)
        values = torch.stack([self.targets[index].reshape(-1)[f] for index, f in zip(indices, flat, strict=True)])
        counts = torch.tensor([float(self.counts[i]) for i in indices])
        return PointBatch(grid[:, None].float(), values, counts / counts.sum().clamp(min=1), rows, cols, sizes)


def logits_at(logits: Tensor, grid: Tensor) -> Tensor:
    """(B, C, rows, cols) low-resolution logits read at ``grid`` (B, 1, K, 2) points: (B, C, K)."""
    return F.grid_sample(logits, grid.to(logits.device), mode="bilinear", padding_mode="border",
                         align_corners=False)[:, :, 0]


def rows_at(table: Tensor, corners: tuple[Tensor, Tensor]) -> Tensor:
    """Channel-last logits (B, rows * cols, C) read at the points whose ``PointBatch.corners`` are given:
    (B, K, C), each point the weighted sum of its 4 source cells (``embedding_bag``: fast forward and backward,
    unlike ``grid_sample`` on many channels)."""
    index, weight = corners
    flat = F.embedding_bag(index.to(table.device), table.reshape(-1, table.shape[-1]),
                           per_sample_weights=weight.to(table.device, table.dtype), mode="sum")
    return flat.view(len(table), -1, table.shape[-1])


def cells_at(values: Tensor, corners: tuple[Tensor, Tensor]) -> Tensor:
    """``rows_at`` for few channels (B, cells, C) -> (B, K, C): the 4 corners picked by ``index_select``, whose
    backward is a plain scatter-add (``embedding_bag``'s sorts its indices first, which costs more here)."""
    index, weight = corners
    picked = values.reshape(-1, values.shape[-1]).index_select(0, index.to(values.device).reshape(-1))
    weighted = picked.view(*index.shape, -1) * weight.to(values.device, values.dtype)[..., None]
    return weighted.sum(1).view(len(values), -1, values.shape[-1])


def point_cross_entropy(logits: Tensor, points: PointBatch, per_head: bool = False) -> Tensor:
    """Estimate of the batch's mean cross-entropy over valid pixels from channel-last (B, K, C) logits at the
    points; with (B, K, heads, C) logits, the sum of every head's estimate (``per_head``: each head's, (heads,)).
    Cross-entropy as log-sum-exp less the label's logit: the same value as ``F.cross_entropy``, about 3x faster
    forward and backward on a CPU at few classes (its log-softmax is slow along a short last dimension)."""
    extra = logits.dim() - 3  # dimensions between the points and the classes
    values = points.values.to(logits.device).long().view(*points.values.shape, *[1] * extra, 1)
    per_point = torch.logsumexp(logits, -1) - logits.gather(-1, values.expand(*logits.shape[:-1], 1))[..., 0]
    weights = points.weights.to(logits.device).view(-1, *[1] * extra)
    per_image = per_point.mean(1) * weights  # (B, heads...)
    return per_image.sum(0) if per_head else per_image.sum()


def depth_last(logits: Tensor, bins: Tensor) -> Tensor:
    """Channel-last (..., bins) logits -> (...) depth: the bin centres weighted by ``probes.bin_norm``'s default."""
    return bin_weights(logits, dim=-1) @ bins


def depth_at(logits: Tensor, bins: Tensor) -> Tensor:
    """(B, bins, ...) logits -> (B, ...) depth: the bin centres weighted by ``probes.bin_norm``'s default (DINOv2's
    ``linear``)."""
    return torch.einsum("bk...,k->b...", bin_weights(logits, dim=1), bins)


def point_silog(depth: Tensor, points: PointBatch) -> Tensor:
    """Scale-invariant log loss sqrt(E g^2 - lambda (E g)^2), g = log pred - log label, from (B, K) predicted
    depth at the points, both moments estimated with each image's weight."""
    weights = points.weights.to(depth.device)
    g = depth.clamp(min=1e-6).log() - points.values.to(depth.device).float().clamp(min=1e-12).log()
    first, second = (g.mean(1) * weights).sum(), ((g * g).mean(1) * weights).sum()
    return (second - SILOG_LAMBDA * first**2).clamp(min=1e-12).sqrt()
