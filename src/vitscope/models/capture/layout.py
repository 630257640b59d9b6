"""Where tokens sit: prefix tokens (CLS, registers) and patches on a grid."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from vitscope.metrics.locality import grid_distances


@dataclass(frozen=True)
class TokenLayout:
    """Token geometry of one attention layer.

    Tokens are ``num_prefix_tokens`` prefix tokens (CLS first, then registers) followed by the patches of
    a ``grid_size`` = (rows, cols) grid in row-major order. ``patch_size`` is in pixels. ``distances`` is
    an optional explicit patch-query x patch-key distance matrix in patch units (Swin windows, PVT keys);
    without it the plain grid's Euclidean distances are used.
    """

    num_prefix_tokens: int
    grid_size: tuple[int, int]
    patch_size: int
    num_registers: int = 0
    distances: Tensor | None = None

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def has_cls(self) -> bool:
        return self.num_prefix_tokens > self.num_registers

    def distance_matrix(self) -> Tensor:
        """Patch-query x patch-key distances in patch units."""
        return self.distances if self.distances is not None else grid_distances(self.grid_size)
