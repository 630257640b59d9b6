"""The page's binary data: typed arrays in gzip-compressed blobs, written into the HTML as text with 1-2 % overhead.

Arrays are appended one after another, each aligned to 4 bytes, and referenced from the page's JSON as
``{"blob", "offset", "length", "dtype", "shape"}`` into the named blob once decompressed. float16 arrays are stored
as two byte planes (every value's low byte, then every high byte), which gzip compresses better than interleaved
bytes (the high bytes hold sign and exponent, a narrow set of values); the page joins the planes again.

The page is encoded as windows-1252 (``<meta charset="windows-1252">``), so every byte of the compressed blob is
one character of the HTML file: base64 would cost a third more. Three bytes cannot stand in a ``<script>`` element
as they are (NUL becomes U+FFFD, CR becomes LF, ``<`` could end the element), so they, and the escape byte ``=``,
are written as ``=`` and a digit (``binary_text``); about 1.6 % more bytes on random data. Everything else in the
page is ASCII. ``text_bytes`` is the decoder the page's JavaScript mirrors (static/data.js), for bytes read as
windows-1252 (the saved file) or as Latin-1 (the same text handed over as a string, e.g. a Jupyter ``srcdoc``).
"""

from __future__ import annotations

import gzip
from typing import Any

import torch
from torch import Tensor

DTYPES = {torch.uint8: "uint8", torch.int32: "int32", torch.float32: "float32", torch.float16: "float16"}
ESCAPE = b"="
ESCAPED = (b"=", b"\0", b"\r", b"<")  # written as =0, =1, =2, =3; "=" first, so the others stay unambiguous


class Blob:
    """Typed arrays appended one after another, 4-byte aligned; ``name`` is the blob's name in the page."""

    def __init__(self, name: str, level: int = 6) -> None:
        self.name, self.level = name, level
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, array: Tensor) -> dict[str, Any]:
        """Append ``array`` (uint8, int32, float32 or float16: byte planes) and return its reference."""
        array = array.detach().cpu().contiguous()
        if array.dtype not in DTYPES:
            raise TypeError(f"cannot store {array.dtype}; use uint8, int32, float32 or float16")
        values = array.numpy()
        if array.dtype == torch.float16:  # low bytes, then high bytes
            data = values.view("u1").reshape(-1, 2).T.tobytes()
        else:
            data = values.tobytes()
        ref = {"blob": self.name, "offset": self.size, "length": array.numel(), "dtype": DTYPES[array.dtype],
               "shape": list(array.shape)}
        pad = (-len(data)) % 4
        self.parts.append(data + b"\0" * pad)
        self.size += len(data) + pad
        return ref

    def compressed(self) -> bytes:
        return gzip.compress(b"".join(self.parts), compresslevel=self.level, mtime=0)


def binary_text(data: bytes) -> bytes:
    """``data`` as bytes that can stand inside a ``<script>`` element of a windows-1252 page (module docstring)."""
    for digit, byte in enumerate(ESCAPED):
        data = data.replace(byte, ESCAPE + str(digit).encode())
    return data


def _windows_1252() -> dict[int, int]:
    """Characters above U+00FF that windows-1252 gives bytes 0x80-0x9F, and those bytes (WHATWG's encoding: the
    five bytes it leaves undefined stay U+0081 ... U+009D)."""
    table = {}
    for byte in range(0x80, 0xA0):
        try:
            char = bytes([byte]).decode("cp1252")
        except UnicodeDecodeError:
            continue
        if ord(char) > 0xFF:
            table[ord(char)] = byte
    return table


def text_bytes(text: str) -> bytes:
    """The bytes a ``binary_text`` blob encodes, from the blob's text as the page's parser sees it."""
    specials = _windows_1252()
    raw = bytes(specials.get(ord(ch), ord(ch)) for ch in text) if any(ord(ch) > 0xFF for ch in text) \
        else text.encode("latin-1")
    out, i = bytearray(), 0
    while True:
        j = raw.find(ESCAPE, i)
        if j < 0:
            out += raw[i:]
            return bytes(out)
        out += raw[i:j] + ESCAPED[raw[j + 1] - ord("0")]
        i = j + 2
