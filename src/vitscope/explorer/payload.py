"""The page's data: a JSON description and two gzip-compressed blobs of typed arrays (``vitscope.explorer.blob``).

Each layer's rows are stored in one of two forms (``vitscope.explorer.rows.stored_form``):

* ``maps``: ``vitscope.explorer.quantize`` codes (uint8, one float32 bin width per row: 255 levels up to the row
  maximum, above an absolute error floor), in the blob ``main``. The floor starts at 0 and is raised (``FLOORS``)
  until the page fits ``max_bytes``; the page states the resulting bound on the error of a shown probability and
  the largest error measured.
* ``qk``: queries and centred keys per kept head and image (float16, or float32 where float16 rows would err more
  than ``rows.TOLERANCE``), in the blob ``qk``, packed once; the page computes each row with the layer's scale and
  normaliser, and states the largest error measured over every row.

Norms and geometry arrays go to ``main`` too.
"""

from __future__ import annotations

import base64
import io
import json
import math
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitscope.explorer.blob import Blob, binary_text
from vitscope.explorer.measure import ModelRecord, QKRows
from vitscope.explorer.quantize import dequantize, max_error_bound, quantize_rows
from vitscope.explorer.rows import ARITHMETIC, TOLERANCE

LEVELS = 255
FLOORS = (0.0, 1 / 8160, 1 / 4080, 1 / 2040, 1 / 1020, 1 / 510, 1 / 255, 1 / 128, 1 / 64)  # absolute error floors
ZERO_COLOUR = (150, 150, 150)  # exact zeros: a flat grey that the colour map (viridis) never takes


def jsonable(value: Any) -> Any:
    """Tensors to lists and non-finite floats to None, recursively."""
    if isinstance(value, Tensor):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def picture_urls(pictures: Tensor) -> list[str]:
    """Data URLs of uint8 pictures (images, 3, H, W): PNG up to 64 pixels a side, JPEG (quality 92) above."""
    urls = []
    for picture in pictures:
        buffer = io.BytesIO()
        image = Image.fromarray(picture.permute(1, 2, 0).numpy())
        small = max(picture.shape[-2:]) <= 64
        image.save(buffer, format="PNG" if small else "JPEG", **({} if small else {"quality": 92}))
        urls.append(f"data:image/{'png' if small else 'jpeg'};base64," + base64.b64encode(buffer.getvalue()).decode())
    return urls


def viridis() -> list[list[int]]:
    """256 RGB entries of matplotlib's viridis colour map."""
    from matplotlib import colormaps

    table = colormaps["viridis"](np.linspace(0.0, 1.0, 256))[:, :3]
    return (table * 255).round().astype(int).tolist()


def _qk_json(rows: QKRows, blob: Blob) -> dict[str, Any]:
    """A qk layer's JSON part: per kept head, per image, its queries and keys (appended to ``blob``) and error."""
    heads = []
    for slot in range(rows.queries.shape[1]):
        images = []
        for image in range(rows.queries.shape[0]):
            dtype = torch.float16 if bool(rows.half[image, slot]) else torch.float32
            images.append({"q": blob.add(rows.queries[image, slot].to(dtype)),
                           "k": blob.add(rows.keys[image, slot].to(dtype)), "error": float(rows.error[image, slot])})
        heads.append(images)
    return {"scale": rows.scale, "normalizer": rows.spec, "heads": heads}


def _model_json(record: ModelRecord, blob: Blob, floor: float, errors: dict[str, list[float]],
                qk: dict[int, dict[str, Any]], every: int = 1) -> dict[str, Any]:
    """One model's JSON part; appends the arrays of its maps layers (every ``every``-th layer) to ``blob`` and
    their measured errors and bounds to ``errors``; ``qk`` holds its qk layers' parts by layer index."""
    layers = []
    for layer in record.layers[::every]:
        part: dict[str, Any] = {"form": layer.form}
        if layer.rows is None:
            codes, steps = quantize_rows(layer.maps, LEVELS, floor)
            errors["measured"].append(float((dequantize(codes, steps) - layer.maps).abs().max()))
            errors["bound"].append(max_error_bound(steps))
            part.update(codes=blob.add(codes), steps=blob.add(steps))
        else:
            part["qk"] = qk[layer.index]
        layers.append({
            "index": layer.index, "number": layer.index + 1, "heads": layer.heads, "num_heads": layer.num_heads,
            "geometry": layer.geometry, **part,
            "norms": blob.add(layer.norms.float().contiguous()),
            "arrays": {name: blob.add(value) for name, value in layer.arrays.items()},
            "mad_image": jsonable(layer.mad_image), "entropy_image": jsonable(layer.entropy_image),
            "mad_set": jsonable(layer.mad_set), "entropy_set": jsonable(layer.entropy_set),
            "skipped": jsonable(layer.skipped),
        })
    return {"label": record.label, "depth": record.depth, "layers": layers,
            "threshold": {"spec": record.threshold.spec, "value": record.threshold.value,
                          "detect_layer": record.detect_layer + 1, "high_norm_fraction": record.high_norm_fraction}}


def _packed(records: list[ModelRecord], floor: float, qk: list[dict[int, dict[str, Any]]], every: int = 1):
    blob, errors = Blob("main"), {"measured": [0.0], "bound": [0.0]}
    models = [_model_json(r, blob, floor, errors, parts, every) for r, parts in zip(records, qk, strict=True)]
    return models, blob, binary_text(blob.compressed()), errors


def _qk_packed(records: list[ModelRecord]) -> tuple[list[dict[int, dict[str, Any]]], Blob, bytes]:
    """Every qk layer's part, by model and layer index, and their blob (packed once, whatever the floor)."""
    blob = Blob("qk")
    parts = [{layer.index: _qk_json(layer.rows, blob) for layer in r.layers if layer.rows is not None}
             for r in records]
    return parts, blob, binary_text(blob.compressed())


def _precision(records: list[ModelRecord]) -> dict[str, Any]:
    """What the page says of its qk layers: counts of float16 and float32 head-images, and the largest error."""
    rows = [layer.rows for r in records for layer in r.layers if layer.rows is not None]
    half = sum(int(x.half.sum()) for x in rows)
    full = sum(int(x.half.numel()) for x in rows) - half
    measured = max((float(x.error.max()) for x in rows if x.error.numel()), default=0.0)
    text = ""
    if rows:
        text = (f"{len(rows)} layer{'s' * (len(rows) != 1)} are stored as queries and keys (after q/k norm and rotary "
                "embedding; keys centred on their mean, which leaves every row unchanged), and the page computes each "
                "row with the layer's scale and normaliser, exact zeros included: "
                f"{half} head-images in float16, {full} in float32 (where float16 rows would err more than "
                f"{TOLERANCE:.0%} of the row maximum). Over every row of every image, the largest error against the "
                f"float32 rows is {100 * measured:.2g} % of the row's maximum (measured when the page was built).")
    return {"layers": len(rows), "half": half, "full": full, "measured": measured, "tolerance": TOLERANCE,
            "arithmetic": ARITHMETIC, "text": text}


def meta_json(meta: dict[str, Any]) -> str:
    """The page's JSON part, ASCII only; "<" as its JSON escape, so that no text in the data (a caption, a label) can
    end or confuse the <script> element it sits in."""
    return json.dumps(jsonable(meta), separators=(",", ":"), allow_nan=False, ensure_ascii=True).replace("<", "\\u003c")


def _maps_text(layers: int, floor: float, bound: float, measured: float) -> str:
    if not layers:
        return ""
    coarsest = f", but no finer than an error of {floor:.2g}" if floor else ""
    return (f"{layers} layer{'s' * (layers != 1)} are stored as attention rows in 8-bit codes with one bin width per "
            f"row ({LEVELS} bins up to the row maximum{coarsest}); code 0 is kept for exact zeros. A shown probability "
            f"is off by at most {bound:.2g}; the largest error over every stored row is {measured:.2g}.")


def build_payload(records: list[ModelRecord], pictures: Tensor, *, captions: list[str], title: str,
                  max_bytes: int = 100_000_000, text_bytes: int = 0) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(JSON description, encoded blobs by name) for ``records`` of the same uint8 ``pictures`` (images, 3, H, W),
    with the smallest error floor of the maps layers whose page fits ``max_bytes``; ``text_bytes``: the page's bytes
    besides its JSON and blobs (template, CSS, script). A fourth of the layers, packed first, picks the floor to
    try, so most pages are packed in full once or twice."""
    urls = picture_urls(pictures)
    qk, qk_blob, qk_text = _qk_packed(records)
    precision = _precision(records)
    maps_layers = sum(layer.rows is None for r in records for layer in r.layers)

    def assemble(floor: float, every: int = 1) -> tuple[dict[str, Any], bytes, int]:
        """The description and main blob at ``floor`` and the page's size (of every ``every``-th layer)."""
        models, blob, packed, errors = _packed(records, floor, qk, every)
        measured, bound = max(errors["measured"]), max(errors["bound"])
        # any shown probability: within the maps' bound, or a qk row's measured error times its maximum (<= 1)
        max_error = max(bound, precision["measured"] + ARITHMETIC if precision["layers"] else 0.0)
        meta = {
            "version": 2, "title": title, "images": urls, "captions": captions, "models": models,
            "colormap": viridis(), "zero_colour": list(ZERO_COLOUR), "max_error": max_error,
            "blobs": {"main": blob.size, "qk": qk_blob.size},
            "quantization": {"levels": LEVELS, "floor": floor, "bound": bound, "measured": measured, "layers":
                             maps_layers, "text": _maps_text(maps_layers, floor, bound, measured)},
            "precision": precision,
            "notes": "MAD, entropy and norms are computed in float32 from the recorder's maps before any storage.",
        }
        return meta, packed, text_bytes + len(meta_json(meta)) + len(packed) + len(qk_text)

    fixed = text_bytes + len(qk_text) + sum(map(len, urls))
    if fixed > max_bytes:
        raise ValueError(f"the page would take {fixed / 1e6:.3g} MB ({len(qk_text) / 1e6:.3g} MB of queries and "
                         f"keys), above {max_bytes / 1e6:.3g} MB; keep fewer --layers, --heads or images "
                         "(--num-images), or raise --max-mb")
    sampled = max(1, min(len(r.layers) for r in records) // 4)
    start = 0
    if sampled > 1:  # the floor from a fourth of the layers: what scales with them, times four (and a margin)
        while start < len(FLOORS) - 1 and fixed + (assemble(FLOORS[start], sampled)[2] - fixed) * sampled * 1.05 \
                > max_bytes:
            start += 1
    for floor in FLOORS[start:]:
        meta, packed, size = assemble(floor)
        if size <= max_bytes:
            return meta, {"main": packed, "qk": qk_text}
    raise ValueError(f"the maps do not fit in {max_bytes / 1e6:.3g} MB even with an error of "
                     f"{FLOORS[-1] / 2:.2g}; keep fewer --layers, --heads or images, or raise --max-mb")
