"""The explorer page: one self-contained HTML file (inline CSS, JavaScript and data; no network).

The file is windows-1252 text whose every byte outside the data is ASCII (non-ASCII text becomes character
references or ``\\u`` escapes), so that the compressed blobs can be written byte for byte (``vitscope.explorer.blob``).
"""

from __future__ import annotations

import html
import re
from importlib import resources
from typing import Any

from vitscope.explorer.payload import meta_json

SCRIPT_PARTS = ("data.js", "rows.js", "draw.js", "panels.js", "api.js")  # joined, in order, in one function scope
BLOBS = ("main", "qk")


def _static(name: str) -> str:
    return resources.files("vitscope.explorer").joinpath("static", name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot close the <script> element it sits in."""
    return text.replace("</", "<\\/")


def _ascii_js(text: str) -> str:
    """JavaScript (or CSS comments and strings) with every non-ASCII character as a ``\\uXXXX`` escape: the page's
    scripts hold them only in string literals and comments, where the escape means the same character."""
    return re.sub(r"[^\x00-\x7f]", lambda m: f"\\u{ord(m.group()):04x}", text)


def script() -> str:
    """The page's JavaScript: ``SCRIPT_PARTS`` in one strict-mode function scope, ASCII only."""
    return _ascii_js("(function () {\n'use strict';\n" + "\n".join(_static(name) for name in SCRIPT_PARTS) + "})();\n")


def static_bytes(title: str) -> int:
    """The bytes of a page titled ``title`` besides its JSON part and blobs (template, CSS, script)."""
    bare = {"title": title}
    return len(render_page(bare, {name: b"" for name in BLOBS})) - len(meta_json(bare))


def render_page(meta: dict[str, Any], blobs: dict[str, bytes]) -> bytes:
    """The page's bytes for a payload (``vitscope.explorer.payload.build_payload``: the JSON part and the blobs
    encoded by ``blob.binary_text``)."""
    data = meta_json(meta)
    title = html.escape(meta["title"]).encode("ascii", "xmlcharrefreplace").decode("ascii")
    parts = {"title": title, "css": _ascii_js(_static("explorer.css")), "meta": data,
             "js": _script_safe(script())}
    pieces = re.split(r"\{\{blob:(\w+)\}\}", _static("explorer.html"))  # text, name, text, name, text
    out = bytearray()
    for i, piece in enumerate(pieces):
        if i % 2:
            out += blobs[piece]
        else:  # one pass: nothing inserted is read again
            out += re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], piece).encode("ascii")
    return bytes(out)
