"""The page's data: a JSON description and one gzip-compressed binary blob of typed arrays.

Maps are stored as ``vitscope.explorer.quantize`` codes (uint8, one float32 scale per row). ``levels`` starts at
255 and is halved until the compressed blob fits ``max_bytes`` (the page states the levels and the error bound
that result). Arrays are referenced from the JSON as ``{"offset", "length", "dtype", "shape"}`` into the
decompressed blob, each aligned to 4 bytes.
"""

from __future__ import annotations

import base64
import gzip
import io
import math
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitscope.explorer.measure import ModelRecord
from vitscope.explorer.quantize import dequantize, max_error_bound, quantize_rows

ZERO_COLOUR = (150, 150, 150)  # exact zeros: a flat grey that the colour map (viridis) never takes
DTYPES = {torch.uint8: "uint8", torch.int32: "int32", torch.float32: "float32"}


class Blob:
    """Typed arrays appended one after another, 4-byte aligned."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, array: Tensor) -> dict[str, Any]:
        array = array.detach().cpu().contiguous()
        if array.dtype not in DTYPES:
            raise TypeError(f"cannot store {array.dtype}; use uint8, int32 or float32")
        data = array.numpy().tobytes()
        ref = {"offset": self.size, "length": array.numel(), "dtype": DTYPES[array.dtype], "shape": list(array.shape)}
        pad = (-len(data)) % 4
        self.parts.append(data + b"\0" * pad)
        self.size += len(data) + pad
        return ref

    def compressed(self) -> bytes:
        return gzip.compress(b"".join(self.parts), compresslevel=6, mtime=0)


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
    """PNG data URLs of uint8 pictures (images, 3, H, W)."""
    urls = []
    for picture in pictures:
        buffer = io.BytesIO()
        Image.fromarray(picture.permute(1, 2, 0).numpy()).save(buffer, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    return urls


def viridis() -> list[list[int]]:
    """256 RGB entries of matplotlib's viridis colour map."""
    from matplotlib import colormaps

    table = colormaps["viridis"](np.linspace(0.0, 1.0, 256))[:, :3]
    return (table * 255).round().astype(int).tolist()


def _model_json(record: ModelRecord, blob: Blob, levels: int, errors: dict[str, list[float]]) -> dict[str, Any]:
    """One model's JSON part; appends its arrays to ``blob`` and its measured errors and bounds to ``errors``."""
    layers = []
    for layer in record.layers:
        codes, scales = quantize_rows(layer.maps, levels)
        errors["measured"].append(float((dequantize(codes, scales, levels) - layer.maps).abs().max()))
        errors["bound"].append(max_error_bound(scales, levels))
        layers.append({
            "index": layer.index, "number": layer.index + 1, "heads": layer.heads, "num_heads": layer.num_heads,
            "geometry": layer.geometry, "codes": blob.add(codes), "scales": blob.add(scales.float()),
            "norms": blob.add(layer.norms.float().contiguous()),
            "arrays": {name: blob.add(value) for name, value in layer.arrays.items()},
            "mad_image": jsonable(layer.mad_image), "entropy_image": jsonable(layer.entropy_image),
            "mad_set": jsonable(layer.mad_set), "entropy_set": jsonable(layer.entropy_set),
            "skipped": jsonable(layer.skipped),
        })
    return {"label": record.label, "depth": record.depth, "layers": layers,
            "threshold": {"spec": record.threshold.spec, "value": record.threshold.value,
                          "detect_layer": record.detect_layer + 1, "high_norm_fraction": record.high_norm_fraction}}


def build_payload(records: list[ModelRecord], pictures: Tensor, *, captions: list[str], title: str,
                  max_bytes: int = 24_000_000) -> tuple[dict[str, Any], bytes]:
    """(JSON description, gzip blob) for ``records`` of the same uint8 ``pictures`` (images, 3, H, W)."""
    urls = picture_urls(pictures)
    levels = 255
    while True:
        blob, errors = Blob(), {"measured": [0.0], "bound": [0.0]}
        models = [_model_json(r, blob, levels, errors) for r in records]
        packed = blob.compressed()
        if len(packed) * 4 / 3 + sum(map(len, urls)) <= max_bytes or levels < 8:
            break
        levels //= 2
    measured, bound = max(errors["measured"]), max(errors["bound"])
    meta = {
        "version": 1, "title": title, "images": urls, "captions": captions, "models": models,
        "colormap": viridis(), "zero_colour": list(ZERO_COLOUR), "blob_bytes": blob.size,
        "quantization": {"levels": levels, "bound": bound, "measured": measured,
                         "text": (f"Attention rows are stored as 8-bit codes with one scale (the row maximum) per row, "
                                  f"{levels} levels; code 0 is kept for exact zeros. A shown probability is off by at "
                                  f"most {bound:.2g} (bound: row maximum / {2 * levels}); the largest error over "
                                  f"every stored row is {measured:.2g}. MAD, entropy and norms are computed in "
                                  "float32 before quantisation.")},
    }
    return meta, packed
