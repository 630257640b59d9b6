"""The page's data: a JSON description and one gzip-compressed binary blob of typed arrays.

Maps are stored as ``vitscope.explorer.quantize`` codes (uint8, one float32 bin width per row: 255 levels up to
the row maximum, above an absolute error floor). The floor starts at 0 and is raised (``FLOORS``) until the page
fits ``max_bytes``; the page states the resulting bound on the error of a shown probability and the largest error
measured. Arrays are referenced from the JSON as ``{"offset", "length", "dtype", "shape"}`` into the decompressed
blob, each aligned to 4 bytes.
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

LEVELS = 255
FLOORS = (0.0, 1 / 8160, 1 / 4080, 1 / 2040, 1 / 1020, 1 / 510, 1 / 255, 1 / 128, 1 / 64)  # absolute error floors
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


def _model_json(record: ModelRecord, blob: Blob, floor: float, errors: dict[str, list[float]],
                every: int = 1) -> dict[str, Any]:
    """One model's JSON part; appends its arrays (of every ``every``-th layer) to ``blob`` and its measured errors
    and bounds to ``errors``."""
    layers = []
    for layer in record.layers[::every]:
        codes, steps = quantize_rows(layer.maps, LEVELS, floor)
        errors["measured"].append(float((dequantize(codes, steps) - layer.maps).abs().max()))
        errors["bound"].append(max_error_bound(steps))
        layers.append({
            "index": layer.index, "number": layer.index + 1, "heads": layer.heads, "num_heads": layer.num_heads,
            "geometry": layer.geometry, "codes": blob.add(codes), "steps": blob.add(steps),
            "norms": blob.add(layer.norms.float().contiguous()),
            "arrays": {name: blob.add(value) for name, value in layer.arrays.items()},
            "mad_image": jsonable(layer.mad_image), "entropy_image": jsonable(layer.entropy_image),
            "mad_set": jsonable(layer.mad_set), "entropy_set": jsonable(layer.entropy_set),
            "skipped": jsonable(layer.skipped),
        })
    return {"label": record.label, "depth": record.depth, "layers": layers,
            "threshold": {"spec": record.threshold.spec, "value": record.threshold.value,
                          "detect_layer": record.detect_layer + 1, "high_norm_fraction": record.high_norm_fraction}}


def _packed(records: list[ModelRecord], floor: float, every: int = 1):
    blob, errors = Blob(), {"measured": [0.0], "bound": [0.0]}
    models = [_model_json(r, blob, floor, errors, every) for r in records]
    return models, blob, blob.compressed(), errors


def build_payload(records: list[ModelRecord], pictures: Tensor, *, captions: list[str], title: str,
                  max_bytes: int = 24_000_000) -> tuple[dict[str, Any], bytes]:
    """(JSON description, gzip blob) for ``records`` of the same uint8 ``pictures`` (images, 3, H, W), with the
    smallest error floor whose page fits ``max_bytes`` (base64 blob and pictures); a fourth of the layers, packed
    first, picks the floor to try, so most pages are packed in full once or twice."""
    urls = picture_urls(pictures)
    room = max_bytes - sum(map(len, urls)) - 200_000  # the JSON part and the script
    sampled = max(1, min(len(r.layers) for r in records) // 4)

    def fits(size: float) -> bool:
        return size * 4 / 3 <= room

    start = 0
    if sampled > 1:
        while start < len(FLOORS) - 1 and not fits(len(_packed(records, FLOORS[start], sampled)[2]) * sampled * 1.05):
            start += 1
    for floor in FLOORS[start:]:
        models, blob, packed, errors = _packed(records, floor)
        if fits(len(packed)):
            break
    else:
        raise ValueError(f"the maps do not fit in {max_bytes / 1e6:.0f} MB even with an error of "
                         f"{FLOORS[-1] / 2:.2g}; keep fewer --layers, --heads or images, or raise --max-mb")
    measured, bound = max(errors["measured"]), max(errors["bound"])
    text = (f"Attention rows are stored as 8-bit codes with one bin width per row ({LEVELS} bins up to the row maximum"
            + (f", but no finer than an error of {floor:.2g}" if floor else "") + "); code 0 is kept for exact zeros. "
            f"A shown probability is off by at most {bound:.2g}; the largest error over every stored row is "
            f"{measured:.2g}. MAD, entropy and norms are computed in float32 before quantisation.")
    meta = {
        "version": 1, "title": title, "images": urls, "captions": captions, "models": models,
        "colormap": viridis(), "zero_colour": list(ZERO_COLOUR), "blob_bytes": blob.size,
        "quantization": {"levels": LEVELS, "floor": floor, "bound": bound, "measured": measured, "text": text},
    }
    return meta, packed
