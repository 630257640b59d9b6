"""Pieces of a self-contained HTML report: a style sheet, tables of flat rows, embedded PNG figures."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

STYLE = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:1em 0}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.6em 1em}code{background:#f3f3f3;padding:0 3px}
.reproduced{color:#1b7f2a;font-weight:600}.not{color:#b3261e;font-weight:600}.untested{color:#666}
.opening{font-size:15px;line-height:1.45;border-left:4px solid #3b6ea8;padding:.4em 1em;background:#f2f6fb}
.back{font-size:13px}
.wide{overflow-x:auto}td.long{min-width:22em;text-align:left}"""
LONG_CELL = 40  # characters from which a cell is prose (a power line, a method): it keeps a readable width
INDEX_LINK = '<p class="back"><a href="../index.html">&larr; all studies (index.html)</a></p>'


def index_link(report_dir: str | Path) -> str:
    """The link back to ``index.html`` one folder up (where ``vitscope demo`` writes it); empty when there is
    none, so that a study run on its own has no dead link."""
    return INDEX_LINK if (Path(report_dir).parent / "index.html").is_file() else ""


def fmt(value: Any) -> str:
    """A cell: 4 significant figures for floats (1e-05, not 0.0000; n/a for NaN and None), lists joined, mappings
    as JSON, text escaped."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "n/a" if value != value else f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return html.escape(json.dumps(value))
    return html.escape(str(value))


def cell(value: Any) -> str:
    """One ``<td>``: a prose cell (``LONG_CELL`` characters or more) is class "long", which keeps it at least
    22em wide and left-aligned instead of squeezed to a word a line by its neighbours."""
    text = fmt(value)
    return f'<td class="long">{text}</td>' if len(text) >= LONG_CELL else f"<td>{text}</td>"


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """An HTML table of flat rows (columns: the first row's keys unless given), in a box that scrolls
    sideways when the table is wider than the page (class "wide"), so that no column is squeezed."""
    if not rows:
        return "<p>(none)</p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'



def image(path: Path, alt: str) -> str:
    """A PNG embedded as a data URI."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def page(title: str, sections: list[str]) -> bytes:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>").encode()
