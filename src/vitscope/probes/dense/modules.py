"""The dense heads' parts: their inputs (``HeadInputs``), the training set's statistics (``Standardiser``), the
head module (``DenseHead``), and the fused algebra of several heads that share one standardised batch
(``stacked_table``, ``stacked_logits``: one matrix product for all of them, the CLS half added as a (B, C) term).
Training them is ``vitscope.probes.dense.heads``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitscope.probes.features import LayerFeatures

BN_EPS = 1e-5
_STATS_CHUNK = 64  # images per chunk when computing the statistics


@dataclass
class HeadInputs:
    """One token layer's head inputs: ``patches`` (N, rows * cols, D) in any float dtype (memory-mapped float16
    when cached), ``grid`` (rows, cols) and ``cls`` (N, D) or None."""

    patches: Tensor
    grid: tuple[int, int]
    cls: Tensor | None = None

    @classmethod
    def of(cls, features: LayerFeatures) -> HeadInputs:
        return cls(features.patches, tuple(features.grid), features.cls.float() if features.has_cls else None)

    @classmethod
    def from_maps(cls, maps: Tensor) -> HeadInputs:
        """From (N, D, rows, cols) patch maps (no CLS)."""
        return cls(maps.flatten(2).transpose(1, 2), tuple(maps.shape[-2:]))

    def __len__(self) -> int:
        return len(self.patches)


def _moments(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and biased variance of (N, ..., D) rows, in float64, read in chunks."""
    total, square, count = 0.0, 0.0, 0
    for start in range(0, len(rows), _STATS_CHUNK):
        chunk = rows[start : start + _STATS_CHUNK].double().reshape(-1, rows.shape[-1])
        total, square, count = total + chunk.sum(0), square + (chunk * chunk).sum(0), count + len(chunk)
    mean = total / count
    return mean, (square / count - mean * mean).clamp(min=0)


class Standardiser(nn.Module):
    """(x - mean) / sqrt(var + eps) per channel with the training set's patch (and CLS) statistics."""

    def __init__(self, inputs: HeadInputs):
        super().__init__()
        mean, var = _moments(inputs.patches)
        self.register_buffer("mean", mean.float())
        self.register_buffer("scale", (var + BN_EPS).rsqrt().float())
        if inputs.cls is not None:
            cls_mean, cls_var = _moments(inputs.cls)
            self.register_buffer("cls_mean", cls_mean.float())
            self.register_buffer("cls_scale", (cls_var + BN_EPS).rsqrt().float())

    def patches(self, patches: Tensor) -> Tensor:
        return (patches.to(self.mean.device, torch.float32) - self.mean) * self.scale

    def cls(self, cls: Tensor) -> Tensor:
        return (cls.to(self.cls_mean.device, torch.float32) - self.cls_mean) * self.cls_scale


class DenseHead(nn.Module):
    """Standardisation, a learned per-channel scale and shift, and one linear map of patch tokens (D) or patch
    and CLS tokens (2D) to ``outputs``."""

    def __init__(self, standardiser: Standardiser, dim: int, outputs: int, with_cls: bool):
        super().__init__()
        if with_cls and not hasattr(standardiser, "cls_mean"):
            raise ValueError("this model has no CLS token to concatenate; probe without CLS")
        self.standardiser, self.dim, self.with_cls = standardiser, dim, with_cls
        channels = 2 * dim if with_cls else dim
        self.gamma, self.beta = nn.Parameter(torch.ones(channels)), nn.Parameter(torch.zeros(channels))
        self.linear = nn.Linear(channels, outputs)

    @property
    def outputs(self) -> int:
        return self.linear.out_features

    def folded(self) -> tuple[Tensor, Tensor]:
        """The scale and shift folded into the linear map: weight (C, channels) and bias (C,)."""
        weight = self.linear.weight
        return weight * self.gamma, self.linear.bias + weight @ self.beta

    def low_res(self, patches: Tensor, cls: Tensor | None, grid: tuple[int, int]) -> Tensor:
        """Raw (B, rows * cols, D) patches and (B, D) CLS -> (B, C, rows, cols) logits."""
        return stacked_logits([self], self.standardiser.patches(patches),
                               self.standardiser.cls(cls) if self.with_cls else None, grid)[:, 0]


def stacked_logits(heads: Sequence[DenseHead], patches: Tensor, cls: Tensor | None, grid: tuple[int, int]
                    ) -> Tensor:
    """Standardised (B, P, D) patches and (B, D) CLS through heads sharing them: (B, heads, C, rows, cols)."""
    return stacked_table(heads, patches, cls).permute(0, 2, 3, 1).unflatten(-1, grid)


def stacked_table(heads: Sequence[DenseHead], patches: Tensor, cls: Tensor | None) -> Tensor:
    """Channel-last logits of heads sharing standardised inputs: (B, P, heads, C)."""
    dim = patches.shape[-1]
    folded = [head.folded() for head in heads]
    weight = torch.cat([w[:, :dim] for w, _ in folded])
    bias = torch.cat([b for _, b in folded])
    logits = (patches @ weight.T + bias).unflatten(-1, (len(heads), -1))  # (B, P, heads, C)
    extra = [w[:, dim:] @ cls.T if head.with_cls else None for head, (w, _) in zip(heads, folded, strict=True)]
    if any(e is not None for e in extra):
        zeros = logits.new_zeros(heads[0].outputs, len(patches))
        logits = logits + torch.stack([zeros if e is None else e for e in extra], 0).permute(2, 0, 1)[:, None]
    return logits
