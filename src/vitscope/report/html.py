"""Pieces of self-contained HTML reports: a stylesheet, tables and embedded PNG figures."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:1em 0}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.6em 1em}code{background:#f3f3f3;padding:0 3px}
.paper td{color:#555;font-style:italic}"""


def fmt(value: Any, digits: int = 4) -> str:
    """A cell: floats to ``digits`` decimals (NaN and None as n/a), lists comma-joined, text escaped."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "n/a" if value != value else f"{value:.{digits}f}"
    if isinstance(value, list):
        return html.escape(", ".join(map(str, value)))
    return html.escape(str(value))


def table(rows: list[dict[str, Any]], columns: list[str] | None = None, row_class: str = "class") -> str:
    """An HTML table of ``rows`` (dicts) with ``columns`` (default: the first row's keys); a row's ``row_class``
    key, if present, becomes its CSS class."""
    if not rows:
        return "<p>(none)</p>"
    columns = columns or [c for c in rows[0] if c != row_class]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        (f'<tr class="{html.escape(str(r[row_class]))}">' if r.get(row_class) else "<tr>")
        + "".join(f"<td>{fmt(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image(path: Path, alt: str) -> str:
    """A PNG embedded as a data URI."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def page(title: str, sections: list[str]) -> bytes:
    """A whole HTML document (UTF-8 bytes)."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>").encode()
