"""Pieces of a self-contained HTML report: tables of flat rows, embedded PNG figures, the link back to the
index, and the study page itself (rendered from ``templates/study.html``, style sheet ``templates/report.css``)."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from vitscope.report.render import render

LONG_CELL = 40  # characters from which a cell is prose (a power line, a method): it keeps a readable width
INDEX_LINK = '<p class="back"><a href="../index.html">&larr; all studies (index.html)</a></p>'


def study_results(out: Path, study: str) -> dict[str, Any]:
    """The ``results.json`` of study folder ``out``, or a FileNotFoundError naming the command that writes it."""
    results_file = out / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{results_file} does not exist; run the study first (vitscope study {study})")
    return json.loads(results_file.read_text())


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
    """An HTML table of flat rows (columns: the first row's keys unless given) that fits the report's page: when
    its columns cannot all fit side by side (``min_width_ems`` over ``PAGE_EMS``), the prose columns but the
    first (power lines, methods) leave the header and go into a full-width line under each row, named, so that no
    column (the verdict) is pushed past the right edge. The box scrolls sideways (class "wide") only on windows
    narrower than the page."""
    if not rows:
        return "<p>(none)</p>"
    columns = columns or list(rows[0])
    texts = [{c: fmt(r.get(c)) for c in columns} for r in rows]
    below = prose_columns(texts, columns)
    shown = [c for c in columns if c not in below]
    stacked = ' class="stacked"' if below else ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in shown)
    body = []
    for r, text in zip(rows, texts, strict=True):
        body.append("<tr>" + "".join(cell(r.get(c)) for c in shown) + "</tr>")
        lines = "".join(f"<div><b>{html.escape(c)}</b>: {text[c]}</div>" for c in below if r.get(c) is not None)
        if lines:
            body.append(f'<tr class="prose"><td colspan="{len(shown)}">{lines}</td></tr>')
    return f'<div class="wide"><table{stacked}><tr>{head}</tr>{"".join(body)}</table></div>'


PAGE_EMS = 88  # the report's page (body max-width 1150 px in report.css) in the tables' 13 px ems
CHAR_EMS = 0.6  # one character of a cell or (bold) header, in ems (measured: 7.8 px at 13 px)
CELL_EMS = 1.3  # a cell's padding and border
LONG_EMS = 22  # a prose cell's min-width (td.long in report.css)


def min_width_ems(texts: list[dict[str, str]], columns: list[str]) -> float:
    """The narrowest the table's columns can be side by side, in ems: each column as wide as its longest word
    (header included; prose cells at ``LONG_EMS``), padding added."""
    def widest(text: str) -> float:
        if len(text) >= LONG_CELL:
            return LONG_EMS + CELL_EMS
        return max((len(word) for word in text.split()), default=0) * CHAR_EMS + CELL_EMS

    return sum(max(widest(html.escape(c)), *(widest(t[c]) for t in texts)) for c in columns)


def prose_columns(texts: list[dict[str, str]], columns: list[str]) -> list[str]:
    """The columns to write under each row: none when the table fits ``PAGE_EMS``; else every column but the
    first (the row's name, whose prose cells then keep 14em: ``.stacked td.long`` in report.css) with a prose
    cell."""
    if min_width_ems(texts, columns) <= PAGE_EMS:
        return []
    return [c for c in columns[1:] if any(len(t[c]) >= LONG_CELL for t in texts)]


def image(path: Path, alt: str) -> str:
    """A PNG embedded as a data URI."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def page(title: str, sections: Sequence[Markup | str]) -> bytes:
    """A study's report page (``templates/study.html``): ``title`` escaped, then the sections in order. A section
    the caller built as HTML is passed through ``render.trusted`` (marked safe); plain text is escaped."""
    return render("study.html", title=title, sections=sections)
