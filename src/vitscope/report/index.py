"""``index.html``: one page linking the reports of the studies found in a folder (written by ``vitscope demo``)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping
from pathlib import Path

from vitscope.files import atomic_write_bytes

STYLE = """body{font-family:system-ui,sans-serif;max-width:900px;margin:2em auto;padding:0 1em;color:#222}
li{margin:.4em 0}.missing{color:#888}"""
EXPLORER = ("explorer/explorer.html", "Attention explorer: the sparse demo's backbones before and after training, "
            "softmax vs entmax-1.5 (click a patch)")


def write_index(out: str | Path, studies: Mapping[str, str]) -> Path:
    """Write ``out/index.html`` with a link to ``out/<name>/report.html`` for each study (name -> title) whose
    report exists, the studies not run yet, and the explorer page when it exists; returns its path."""
    out = Path(out)
    items = []
    for name, title in studies.items():
        report = out / name / "report.html"
        if report.is_file():
            when = dt.datetime.fromtimestamp(report.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            items.append(f'<li><a href="{html.escape(name)}/report.html">{html.escape(title)}</a> '
                         f"<small>({when})</small></li>")
        else:
            items.append(f'<li class="missing">{html.escape(title)}: not run yet '
                         f"(<code>vitscope demo {html.escape(name)}</code>)</li>")
    if (out / EXPLORER[0]).is_file():
        items.append(f'<li><a href="{EXPLORER[0]}">{html.escape(EXPLORER[1])}</a></li>')
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>vitscope demos</title><style>{STYLE}</style>"
            f"</head><body><h1>vitscope demos</h1><ul>{''.join(items)}</ul></body></html>")
    return atomic_write_bytes(out / "index.html", page.encode())
