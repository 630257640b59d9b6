"""The explorer page: one self-contained HTML file (inline CSS, JavaScript and data; no network)."""

from __future__ import annotations

import base64
import html
import json
import re
from importlib import resources
from typing import Any

from vitscope.explorer.payload import jsonable


def _static(name: str) -> str:
    return resources.files("vitscope.explorer").joinpath("static", name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot close the <script> element it sits in."""
    return text.replace("</", "<\\/")


SCRIPT_PARTS = ("data.js", "draw.js", "panels.js", "api.js")  # joined, in this order, inside one function scope


def script() -> str:
    """The page's JavaScript: ``SCRIPT_PARTS`` in one strict-mode function scope."""
    return "(function () {\n'use strict';\n" + "\n".join(_static(name) for name in SCRIPT_PARTS) + "})();\n"


def render_page(meta: dict[str, Any], blob: bytes) -> str:
    """The page for a payload (``vitscope.explorer.payload.build_payload``)."""
    # "<" as its JSON escape: no text in the data (a caption, a label) can end or confuse the <script> element
    data = json.dumps(jsonable(meta), separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    parts = {"title": html.escape(meta["title"]), "css": _static("explorer.css"), "meta": data,
             "blob": base64.b64encode(blob).decode("ascii"), "js": _script_safe(script())}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _static("explorer.html"))  # one pass
