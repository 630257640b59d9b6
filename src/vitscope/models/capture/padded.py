"""Padded batches of images with different grids (NaFlex): one layout per image from its patches' coordinates,
and a capture split into groups of images of one layout with padding tokens removed, for metrics."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from vitscope.attention import AttentionEvent
from vitscope.metrics import SoftmaxInputs
from vitscope.models.capture.delivery import Capture, plain_capture
from vitscope.models.capture.layout import TokenLayout


class Group(NamedTuple):
    """Images of one layout in a padded batch: ``rows`` their batch indices, ``tokens`` the indices of their
    prefix tokens and valid patches."""

    layout: TokenLayout
    rows: Tensor
    tokens: Tensor


class PaddedLayouts:
    """Layouts of padded batches; prefix tokens and registers as ``base``, patches from their coordinates (cached
    per distinct set of coordinates)."""

    def __init__(self, base: TokenLayout):
        self.base = base
        self._layouts: dict[bytes, TokenLayout] = {}

    def group(self, coords: Tensor, valid: Tensor, device: torch.device) -> list[Group]:
        """The groups of a batch: ``coords`` (B, N, 2) (row, col) of each patch token and ``valid`` (B, N), True for
        a real patch, both on the CPU; the groups' indices on ``device``."""
        npt = self.base.num_prefix_tokens
        groups: dict[int, tuple[TokenLayout, list[int], Tensor]] = {}
        for image in range(coords.shape[0]):
            keep = valid[image].nonzero().squeeze(1)
            layout = self.layout_of(coords[image, keep])
            if id(layout) not in groups:
                groups[id(layout)] = (layout, [], torch.cat([torch.arange(npt), keep + npt]))
            groups[id(layout)][1].append(image)
        return [Group(layout, torch.tensor(images, device=device), tokens.to(device))
                for layout, images, tokens in groups.values()]

    def layout_of(self, coords: Tensor) -> TokenLayout:
        """The layout of one image's valid patches (N, 2): explicit distances between their coordinates."""
        key = coords.numpy().tobytes()
        if key not in self._layouts:
            grid = (int(coords[:, 0].max()) + 1, int(coords[:, 1].max()) + 1) if len(coords) else (0, 0)
            b = self.base
            self._layouts[key] = TokenLayout(b.num_prefix_tokens, grid, b.patch_size, b.num_registers,
                                             distances=torch.cdist(coords.double(), coords.double()).float())
        return self._layouts[key]


def row_major_coords(shapes: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """(B, length, 2) coordinates and (B, length) validity of patches laid out row-major on grids ``shapes``
    (B, 2), each image's patches first and padding after them (SigLIP2's processor layout)."""
    coords = torch.zeros(len(shapes), length, 2, dtype=torch.long)
    valid = torch.zeros(len(shapes), length, dtype=torch.bool)
    for i, (h, w) in enumerate(shapes.tolist()):
        grid = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
        coords[i, : h * w], valid[i, : h * w] = grid, True
    return coords, valid


def split_capture(event: AttentionEvent, groups: list[Group]) -> Capture:
    """The capture of a padded batch: maps as they are, metrics from ``parts``, one per group."""
    parts = [_part(event, group) for group in groups]
    return plain_capture(event, parts[0].layout, parts)


def _part(event: AttentionEvent, group: Group) -> Capture:
    """The capture of one group restricted to its tokens: masked keys carry no mass, so the restricted rows are the
    attention itself, and an unmasked softmax over the kept keys reproduces it."""
    rows, tokens = group.rows, group.tokens
    q, k = event.q[rows][:, :, tokens], event.k[rows][:, :, tokens]
    qk = SoftmaxInputs(q, k, event.scale) if event.is_softmax else None
    return Capture(group.layout, lambda: event.probs[rows][:, :, tokens][:, :, :, tokens], qk)
