"""Encoded image bytes -> uint8 RGB (3, H, W), guarded: a damaged, empty, oversized or unusual file is one
ValueError naming the file and the fix, never a crash of the process or a silently wrong image.

The header is read first (PIL reads only the header on open): an empty file, one that is no image, or one whose
header declares more than ``MAX_IMAGE_PIXELS`` pixels is refused before any pixel is decoded. JPEGs then go to
torchvision's decoder (libjpeg-turbo), and to PIL when it fails; every other format to PIL: torchvision's PNG decoder
kills the process (SIGSEGV) on image data shorter than its header declares, and PIL fills the missing rows with
zeros without a word, so a PNG's image data is first measured against its header (``png_data_problem``).

What PIL decodes is brought to 8-bit RGB: 16-bit images keep their high byte (as PIL and torchvision reduce 16-bit
colour PNGs), float images with values in [0, 1] are scaled by 255, an animated image gives its first frame (both
said once per process on stderr); other float ranges are refused. EXIF orientation is applied.
"""

from __future__ import annotations

import io
import math
import re
import struct
import sys
import warnings
import zlib

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

MAX_IMAGE_PIXELS = 178_956_970  # PIL's decompression-bomb bound (2 x Image.MAX_IMAGE_PIXELS): 0.5 GB as uint8 RGB
TORCHVISION_FORMATS = ("JPEG", "MPO")  # decoded by torchvision (libjpeg-turbo); the rest by PIL
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_noted: set[str] = set()  # the kinds of conversion already said in this process


def unreadable(where: str, reason: str, fix: str = "re-create or remove this file") -> ValueError:
    """The one-line error for an image file that cannot be decoded: the file, why, and the fix."""
    return ValueError(f"cannot decode image {where}: {reason}; {fix}")


def _note_once(kind: str, text: str) -> None:
    """Say ``text`` on stderr the first time this process meets a conversion of ``kind``."""
    if kind not in _noted:
        _noted.add(kind)
        print(f"vitscope: note: {text}", file=sys.stderr)


def _too_large(where: str, pixels: int) -> ValueError:
    return unreadable(where, f"its header declares {pixels:,} pixels, above the {MAX_IMAGE_PIXELS:,} vitscope decodes "
                             "(a damaged header, or a decompression bomb)",
                      "downscale it if it is a genuine image, else re-create or remove this file")


def _open(data: bytes, where: str) -> Image.Image:
    """The image's header (PIL), refused in one line when the bytes are empty, no image, or too many pixels."""
    if not data:
        raise unreadable(where, "the file is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as err:  # PIL's own bound, which MAX_IMAGE_PIXELS follows
        declared = re.search(r"\((\d+) pixels\)", str(err))
        raise (_too_large(where, int(declared[1])) if declared else unreadable(where, str(err))) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, struct.error, EOFError):
        raise unreadable(where, "not a readable image file") from None
    if image.width * image.height > MAX_IMAGE_PIXELS:  # PIL's bound switched off (Image.MAX_IMAGE_PIXELS = None)
        raise _too_large(where, image.width * image.height)
    if image.width < 1 or image.height < 1:
        raise unreadable(where, f"its header declares a {image.width} x {image.height} image")
    return image


def png_data_problem(data: bytes) -> str | None:
    """Why a PNG's image data does not fill the image its header declares (the IDAT stream inflates to fewer
    bytes than ``height`` filtered rows; an interrupted write), or None when it does. Inflates once, at most the
    declared bytes."""
    if not data.startswith(_PNG_SIGNATURE) or len(data) < 33 or data[12:16] != b"IHDR":
        return None  # PIL refuses it
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    bits = _PNG_CHANNELS.get(colour, 4) * depth
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    expected = 0
    for x0, y0, dx, dy in passes:
        cols, rows = math.ceil(max(width - x0, 0) / dx), math.ceil(max(height - y0, 0) / dy)
        if cols and rows:
            expected += rows * (1 + math.ceil(cols * bits / 8))
    inflate, got, pos = zlib.decompressobj(), 0, 8
    try:
        while pos + 8 <= len(data) and got < expected:
            length, kind = struct.unpack(">I4s", data[pos:pos + 8])
            if kind == b"IDAT":
                pending = data[pos + 8:pos + 8 + length]
                while pending and got < expected:
                    got += len(inflate.decompress(pending, 1 << 20))
                    pending = inflate.unconsumed_tail
            elif kind == b"IEND":
                break
            pos += 12 + length
    except zlib.error as err:
        return f"its image data is corrupt ({err})"
    if got < expected:
        return (f"its image data holds {got:,} of the {expected:,} bytes its {width} x {height} header declares (the "
                "file was cut short, e.g. by an interrupted write)")
    return None


def _to_rgb(image: Image.Image, where: str) -> np.ndarray:
    """A loaded PIL image as uint8 (H, W, 3)."""
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":
        values = np.asarray(image)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise unreadable(where, f"its {mode} pixels hold values in [{values.min()}, {values.max()}], beyond "
                                    "16 bits; save it as an 8- or 16-bit image")
        _note_once("16-bit", f"16-bit images are read at 8 bits (their high byte), e.g. {where}")
        gray = (values.astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if mode == "F":
        values = np.asarray(image)
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if not (np.isfinite(low) and np.isfinite(high) and 0 <= low and high <= 1):
            raise unreadable(where, f"it holds float pixels in [{low:g}, {high:g}]; vitscope reads float images "
                                    "with values in [0, 1]: scale it to [0, 1] or save it as an 8-bit image")
        _note_once("float", f"float images with values in [0, 1] are scaled by 255 to 8 bits, e.g. {where}")
        gray = np.rint(values * 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    return np.asarray(image.convert("RGB"))


def _pil_decode(image: Image.Image, data: bytes, where: str) -> Tensor:
    if image.format == "PNG":
        problem = png_data_problem(data)
        if problem:
            raise unreadable(where, problem)
    frames = getattr(image, "n_frames", 1)
    if frames > 1:
        _note_once("frames", f"animated or multi-page images are read as their first frame, e.g. {where} "
                             f"({frames} frames)")
    try:
        image.load()
        rgb = _to_rgb(ImageOps.exif_transpose(image), where)
    except ValueError as err:
        if str(err).startswith("cannot decode image"):
            raise
        raise unreadable(where, str(err) or type(err).__name__) from None
    except (OSError, SyntaxError, struct.error, EOFError, IndexError, TypeError, MemoryError, zlib.error) as err:
        raise unreadable(where, str(err).splitlines()[0] if str(err) else type(err).__name__) from None
    return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)


def decode_rgb(data: bytes, where: str) -> Tensor:
    """Encoded image bytes -> uint8 RGB (3, H, W), EXIF orientation applied (see the module docstring for how);
    a file that cannot be decoded raises a ValueError naming ``where`` and the fix."""
    with warnings.catch_warnings():  # PIL's bomb and palette warnings; torchvision 0.29's pointer to TorchCodec
        warnings.simplefilter("ignore")
        image = _open(data, where)
        try:
            if image.format in TORCHVISION_FORMATS:
                from torchvision.io import ImageReadMode, decode_jpeg

                try:
                    return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                                       apply_exif_orientation=True)
                except (RuntimeError, ValueError):  # a JPEG libjpeg-turbo's build lacks (12-bit ...) or damaged:
                    pass  # PIL decodes the first, and names what is wrong with the second
            return _pil_decode(image, data, where)
        finally:
            image.close()


def image_header_size(data: bytes, where: str = "(bytes)") -> tuple[int, int]:
    """(height, width) of encoded image bytes, read from the header only; a file that is no image (or declares
    more than ``MAX_IMAGE_PIXELS``) raises a ValueError naming ``where``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image = _open(data, where)
    image.close()
    return image.height, image.width
