"""How large a page will be, worked out from the models' shapes before any model runs, so that a page that cannot
fit the size budget is refused at once, with the flags that shrink it (docs/explore.md, "Size and precision").

Per layer, the form ``rows.stored_form`` will pick is counted at its compressed size as measured: float16 queries
and keys at ``rows.QK_COMPRESSED`` of their raw bytes, 8-bit maps at ``MAPS_SQUEEZED``: the error floor is raised
until the maps fit, and the coarsest one left 2.6 % of the real ViT-S/14's maps at 224 px (0.1 % of random-weight
ones), so maps rarely decide a refusal;
and ``JSON_BYTES`` per head and image for the page's description of them (metrics, array references), plus
``JSON_FIXED`` (colour map, notes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from vitscope.explorer.rows import QK_COMPRESSED, maps_bytes, qk_bytes, stored_form
from vitscope.models import AttentionSite, attention_sites, token_layout
from vitscope.models.capture.hierarchical import PvtReducedKeys, SwinWindows

MAPS_SQUEEZED = 0.05
JSON_BYTES = {"qk": 200, "maps": 50}
JSON_FIXED = 8_000


@dataclass(frozen=True)
class LayerShape:
    """One attention layer's rows: ``queries`` x ``keys`` per head, ``heads`` of ``head_dim`` (0: unknown), and
    whether its rows can come from queries and keys (``plain``)."""

    queries: int
    keys: int
    heads: int
    head_dim: int
    plain: bool


def _heads(module: nn.Module) -> int:
    return int(getattr(module, "num_heads", 0) or getattr(module, "num_attention_heads", 0) or 0)


def layer_shape(model: nn.Module, site: AttentionSite, side: int) -> LayerShape:
    """The shape of ``site``'s rows for square inputs of ``side`` pixels."""
    heads = _heads(site.module)
    canonical = site.canonical
    if isinstance(canonical, SwinWindows):
        rows, area = canonical.layout.distances.shape
        return LayerShape(int(rows), int(area), heads, 0, False)
    if isinstance(canonical, PvtReducedKeys):
        cells = side // canonical.stride
        module = canonical.module
        if getattr(module, "pool", None) is not None:
            size = module.pool.output_size
            keys = size * size if isinstance(size, int) else size[0] * size[1]
        elif getattr(module, "sr", None) is not None:
            keys = (cells // module.sr.stride[0]) ** 2
        else:
            keys = cells * cells
        return LayerShape(cells * cells, keys, heads, 0, False)
    layout = token_layout(model)
    tokens = layout.num_prefix_tokens + (side // layout.patch_size) ** 2
    head_dim = int(getattr(site.module, "head_dim", 0) or getattr(site.module, "attention_head_size", 0) or 0)
    if not head_dim and heads and getattr(model, "embed_dim", None):
        head_dim = int(model.embed_dim) // heads
    return LayerShape(tokens, tokens, heads, head_dim, True)


def layer_bytes(shape: LayerShape, heads: Sequence[int] | None, rows: str) -> int:
    """Estimated compressed bytes of one image of one layer with the kept ``heads`` (0-based; None: all)."""
    kept = shape.heads if heads is None else max(1, len({h for h in heads if 0 <= h < shape.heads}))
    form = stored_form(rows, shape.plain and shape.head_dim > 0, shape.queries, shape.keys, shape.head_dim)
    if form == "qk":
        return int(kept * (qk_bytes(shape.queries, shape.keys, shape.head_dim) * QK_COMPRESSED + JSON_BYTES[form]))
    return int(kept * (maps_bytes(shape.queries, shape.keys) * MAPS_SQUEEZED + JSON_BYTES[form]))


def check_page_size(models: Sequence[nn.Module], layers: Sequence[Sequence[int]], sides: Sequence[int], images: int,
                    heads: Sequence[int] | None, rows: str, max_bytes: int, fixed: int) -> int:
    """The estimated page size in bytes for ``images`` images of ``models`` (their kept 0-based ``layers``, input
    ``sides``); ValueError naming the estimate and the flags that shrink it when above ``max_bytes``. ``fixed``:
    bytes that do not scale with the layers (pictures, script)."""
    per_image = 0
    for model, kept, side in zip(models, layers, sides, strict=True):
        sites = attention_sites(model)
        per_image += sum(layer_bytes(layer_shape(model, sites[i], side), heads, rows) for i in kept)
    fixed += JSON_FIXED
    total = fixed + images * per_image
    if total > max_bytes:
        fit = max(0, (max_bytes - fixed) // max(per_image, 1))
        shrink = (f"use --num-images {fit} or fewer, or keep fewer --layers or --heads" if fit else
                  "keep fewer --layers or --heads")
        raise ValueError(f"the page would take about {total / 1e6:.3g} MB ({images} images at {per_image / 1e6:.3g} "
                         f"MB each), above the {max_bytes / 1e6:.3g} MB budget (--max-mb); {shrink}, or raise "
                         "--max-mb")
    return total
