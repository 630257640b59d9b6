"""Locality of attention: mean attention distance (MAD) and normalised entropy.

Definitions (docs/definitions.md). ``attn`` is (B, heads, Tq, Tk) attention probabilities whose first
``num_prefix_tokens`` queries and keys are prefix tokens (CLS, registers); the rest are patches.

* Restrict ``attn`` to patch queries and patch keys. A query row "has patch mass" when its restricted
  sum is > 0; rows without it (all attention on prefix tokens) are left out of every mean.
* MAD = mean over rows i of sum_j A[i, j] d(i, j), where d is the distance between the centres of
  patches i and j in patch units; with ``renormalize=True`` (default) each row is first divided by its
  patch mass. Units: ``patch`` (raw), ``pixel`` (times ``patch_size``), ``normalized`` (divided by the
  largest entry of the distance matrix; on a grid that is sqrt((gh-1)^2 + (gw-1)^2), so MAD is in [0, 1]).
* Entropy: H_i = -sum_j A[i, j] log A[i, j] on the renormalised rows (0 log 0 = 0), divided by
  log(number of patch keys) when ``normalized``; mean over rows. 0 = one token, 1 = uniform.

An (image, head) without any row of patch mass gives NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

UNITS = ("normalized", "patch", "pixel")


def grid_distances(grid_size: tuple[int, int]) -> Tensor:
    """Euclidean distances (N, N) between patch centres of a (rows, cols) grid, in patch units."""
    gh, gw = grid_size
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()], dim=1).to(torch.float64)
    return torch.cdist(coords, coords).to(torch.float32)


def uniform_mad(grid_size: tuple[int, int], unit: str = "normalized", patch_size: int | None = None) -> float:
    """MAD of uniform patch-to-patch attention on a (rows, cols) grid: the mean pairwise centre distance, in
    ``unit`` (normalized: divided by the largest distance, 0.4178 on 8 x 8; patch: 4.1365 on 8 x 8; pixel:
    times ``patch_size``)."""
    distances = grid_distances(tuple(grid_size)).double()
    value = float(distances.mean())
    if unit == "normalized":
        return value / float(distances.max())
    return value * (patch_size or 1) if unit == "pixel" else value


def _patch_block(attn: Tensor, num_prefix_tokens: int) -> Tensor:
    if attn.ndim != 4:
        raise ValueError(f"attention must be (batch, heads, queries, keys), got shape {tuple(attn.shape)}")
    if not 0 <= num_prefix_tokens < min(attn.shape[-2:]):
        raise ValueError(
            f"num_prefix_tokens={num_prefix_tokens} leaves no patch tokens in attention of shape "
            f"{tuple(attn.shape)}; pass the model's num_prefix_tokens (CLS + registers)"
        )
    block = attn[..., num_prefix_tokens:, num_prefix_tokens:]
    return block if block.dtype == torch.float64 else block.float()


def _row_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean of (B, H, N) ``values`` over rows where ``valid``; NaN where no row is valid."""
    count = valid.sum(dim=-1)
    total = torch.where(valid, values, 0.0).sum(dim=-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.nan)


def _resolve_distances(block: Tensor, grid_size, distances, num_prefix_tokens: int) -> Tensor:
    nq, nk = block.shape[-2:]
    if (grid_size is None) == (distances is None):
        raise ValueError("pass exactly one of grid_size=(rows, cols) or distances=(queries x keys matrix)")
    if distances is None:
        gh, gw = grid_size
        if gh * gw != nq or gh * gw != nk:
            raise ValueError(
                f"grid {gh}x{gw} has {gh * gw} patches but the attention has {nq} query and {nk} key patch "
                f"tokens after {num_prefix_tokens} prefix tokens; pass the model's grid_size and num_prefix_tokens"
            )
        return grid_distances((gh, gw)).to(block.device, block.dtype)
    if tuple(distances.shape) != (nq, nk):
        raise ValueError(
            f"distances have shape {tuple(distances.shape)} but the attention has {nq} x {nk} patch "
            "queries x keys; build the matrix for this layer's geometry"
        )
    return distances.to(block.device, block.dtype)


def unit_scale(distances: Tensor, unit: str, patch_size: int | None = None) -> float:
    """The factor that turns distances in the matrix's own units into ``unit`` (module docstring)."""
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is unknown; use one of {', '.join(UNITS)}")
    if unit == "pixel":
        if not patch_size:
            raise ValueError("unit='pixel' needs patch_size (pixels per patch side)")
        return float(patch_size)
    return 1.0 / float(distances.max()) if unit == "normalized" else 1.0


def mean_attention_distance(
    attn: Tensor,
    grid_size: tuple[int, int] | None = None,
    *,
    num_prefix_tokens: int,
    distances: Tensor | None = None,
    renormalize: bool = True,
    unit: str = "normalized",
    patch_size: int | None = None,
) -> Tensor:
    """Mean attention distance per (image, head): (B, heads). See the module docstring for the definition."""
    block = _patch_block(attn, num_prefix_tokens)
    dist = _resolve_distances(block, grid_size, distances, num_prefix_tokens)
    scale = unit_scale(dist, unit, patch_size)
    mass = block.sum(dim=-1)
    weighted = (block * dist).sum(dim=-1)
    rows = weighted / mass.clamp(min=torch.finfo(mass.dtype).tiny) if renormalize else weighted
    return _row_mean(rows, mass > 0) * scale


def attention_entropy(attn: Tensor, *, num_prefix_tokens: int, normalized: bool = True) -> Tensor:
    """Mean row entropy of the renormalised patch-to-patch attention per (image, head): (B, heads).

    With ``normalized`` it is divided by log(number of patch keys), so it lies in [0, 1]."""
    block = _patch_block(attn, num_prefix_tokens)
    mass = block.sum(dim=-1, keepdim=True)
    probs = block / mass.clamp(min=torch.finfo(mass.dtype).tiny)
    rows = -torch.special.xlogy(probs, probs).sum(dim=-1)
    if normalized:
        num_keys = block.shape[-1]
        rows = rows / math.log(num_keys) if num_keys > 1 else torch.zeros_like(rows)
    return _row_mean(rows, mass.squeeze(-1) > 0)


def locality_row_sums(block: Tensor, distances: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per query row of patch-to-patch attention (B, H, Nq, Nk): patch mass, sum_j A d and sum_j A log A.

    MAD and entropy follow from these (``map_sums``, then ``locality_from_map_sums``)."""
    mass = block.sum(dim=-1)
    weighted = (block * distances).sum(dim=-1)
    plogp = torch.special.xlogy(block, block).sum(dim=-1)
    return mass, weighted, plogp


MAP_SUMS = ("rows", "mad", "weighted", "entropy")


def map_sums(mass: Tensor, weighted: Tensor, plogp: Tensor) -> Tensor:
    """Per (image, head), over the query rows with patch mass (row sums (B, H, N) as ``locality_row_sums``
    gives them): (B, H, 4) = the number of such rows, and the sums of their renormalised distance
    (sum_j A d / m), raw distance (sum_j A d) and renormalised entropy in nats (log m - (sum_j A log A) / m,
    which is -sum_j (A/m) log(A/m)); the names are ``MAP_SUMS``."""
    valid = mass > 0
    safe = mass.clamp(min=torch.finfo(mass.dtype).tiny)
    rows = torch.stack([valid.to(mass.dtype), weighted / safe, weighted, safe.log() - plogp / safe], dim=-1)
    return torch.where(valid.unsqueeze(-1), rows, 0.0).sum(dim=-2)


def patch_map_sums(block: Tensor, distances: Tensor) -> Tensor:
    """``map_sums`` of patch-to-patch attention (B, H, Nq, Nk); one pass over ``block`` under ``torch.compile``."""
    return map_sums(*locality_row_sums(block, distances))


def softmax_map_sums(scaled_q: Tensor, k: Tensor, distances: Tensor, *, prefix: int) -> Tensor:
    """``map_sums`` of softmax(q k^T) restricted to patches, from scaled queries (B, heads, Tq, head_dim) and keys
    (B, heads, Tk, head_dim), without keeping the probabilities."""
    probs = (scaled_q.float() @ k.float().transpose(-2, -1)).softmax(dim=-1)
    return patch_map_sums(probs[..., prefix:, prefix:], distances)


def locality_from_map_sums(sums: Tensor, *, num_keys: int, scale: float, renormalize: bool = True
                           ) -> tuple[Tensor, Tensor]:
    """(MAD, normalised entropy), each (B, heads), from ``map_sums`` (B, heads, 4); ``scale`` converts distances to
    the unit, ``num_keys`` is the number of patch keys per row. NaN where no row has patch mass (0 / 0)."""
    rows = sums[..., 0]
    mad = sums[..., 1 if renormalize else 2] / rows * scale
    entropy = sums[..., 3] / (rows * math.log(num_keys)) if num_keys > 1 else sums[..., 3] * 0 / rows
    return mad, entropy
