"""Where each canonical attention row and key of a recorded layer sits on the image, for drawing.

Every layer is described by its query grid (rows, cols of token cells over the whole image) and one of three key
kinds, matching the canonical maps of ``vitscope.record_attention``:

* ``plain`` (ViTs): rows and keys are the model's tokens, ``prefix`` prefix tokens (CLS, registers) first, then
  the patches row-major; the row of patch q is ``prefix + q``.
* ``window`` (Swin): one row per stage token in window order; ``row_of_cell`` (N,) gives each grid cell's row and
  ``key_cells`` (rows, window area) each key's grid cell, -1 for padding and for keys the shift mask hides
  (``vitscope.metrics.visible_keys.swin_window_keys``, the cyclic shift undone).
* ``reduced`` (PVT-v2): rows are the stage grid row-major; keys are reduced cells whose boxes
  ``key_boxes`` (keys, 4) = (row0, col0, row1, col1) are fractions of the image side (strided cells, or the
  adaptive 7x7 pool's floor/ceil bounds).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from vitscope.metrics.visible_keys import swin_window_keys
from vitscope.models import AttentionSite, TokenLayout
from vitscope.models.capture.hierarchical import PvtReducedKeys, SwinWindows


def prefix_labels(layout: TokenLayout) -> list[str]:
    """Names of the prefix tokens in token order: ``CLS`` (when present), then ``reg1`` .. ``regR``."""
    labels = ["CLS"] if layout.has_cls else []
    return labels + [f"reg{i + 1}" for i in range(layout.num_registers)]


def _pvt_key_boxes(geometry: PvtReducedKeys, h: int, w: int) -> Tensor:
    """(keys, 4) boxes (row0, col0, row1, col1) of a PVT-v2 layer's reduced keys, in fractions of the image."""
    module = geometry.module
    if getattr(module, "pool", None) is not None:  # linear variant: adaptive average pool
        cells = module.pool.output_size
        cells = (cells, cells) if isinstance(cells, int) else tuple(cells)
        axes = [[(math.floor(j * n / c), math.ceil((j + 1) * n / c)) for j in range(c)]
                for n, c in zip((h, w), cells, strict=True)]
    elif getattr(module, "sr", None) is not None:
        r = module.sr.stride[0]
        axes = [[(j * r, (j + 1) * r) for j in range(n // r)] for n in (h, w)]
    else:
        axes = [[(j, j + 1) for j in range(n)] for n in (h, w)]
    boxes = [(r0 / h, c0 / w, r1 / h, c1 / w) for r0, r1 in axes[0] for c0, c1 in axes[1]]
    return torch.tensor(boxes, dtype=torch.float32)


def layer_geometry(model: nn.Module, site: AttentionSite, layout: TokenLayout) -> tuple[dict[str, Any],
                                                                                        dict[str, Tensor]]:
    """(JSON description, index arrays) of one recorded layer; ``layout`` is the one seen while recording."""
    grid = [int(layout.grid_size[0]), int(layout.grid_size[1])]
    canonical = site.canonical
    if isinstance(canonical, SwinWindows):
        block = model.get_submodule(site.name.rsplit(".", 1)[0])
        keys = swin_window_keys(tuple(grid), tuple(block.window_size), tuple(block.shift_size),
                                getattr(block, "attn_mask", None))
        row_of_cell = torch.empty(grid[0] * grid[1], dtype=torch.int32)
        row_of_cell[keys.query] = torch.arange(len(keys.query), dtype=torch.int32)
        key_cells = torch.where(keys.visible, keys.keys, torch.full_like(keys.keys, -1)).to(torch.int32)
        meta = {"kind": "window", "grid": grid, "prefix": 0, "labels": [], "stride": layout.patch_size,
                "window": list(block.window_size), "shift": list(block.shift_size)}
        return meta, {"row_of_cell": row_of_cell, "key_cells": key_cells}
    if isinstance(canonical, PvtReducedKeys):
        boxes = _pvt_key_boxes(canonical, *grid)
        meta = {"kind": "reduced", "grid": grid, "prefix": 0, "labels": [], "stride": canonical.stride,
                "keys": int(boxes.shape[0])}
        return meta, {"key_boxes": boxes}
    meta = {"kind": "plain", "grid": grid, "prefix": layout.num_prefix_tokens, "labels": prefix_labels(layout),
            "stride": layout.patch_size}
    return meta, {}


def query_row(meta: dict[str, Any], arrays: dict[str, Tensor], cell: int | str) -> int:
    """The canonical row of a query: a grid cell (row-major) or ``"cls"`` (plain layers with a CLS token)."""
    if cell == "cls":
        if "CLS" not in meta["labels"]:
            raise ValueError("this layer has no CLS token; pick a patch as the query")
        return 0
    if meta["kind"] == "window":
        return int(arrays["row_of_cell"][cell])
    return meta["prefix"] + int(cell)
