"""``index.html``: one page linking the reports of the studies found in a folder (written by ``vitscope demo``)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping
from pathlib import Path

from vitscope.files import atomic_write_bytes

STYLE = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
li{margin:.4em 0}.missing{color:#888}table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}
.reproduced{color:#1b7f2a;font-weight:600}.not{color:#b3261e;font-weight:600}.untested{color:#8a6d00}"""
EXPLORER = ("explorer/explorer.html", "Attention explorer: the sparse demo's backbones before and after training, "
            "softmax vs entmax-1.5 (click a patch)")


def verdict_table(out: Path, studies: Mapping[str, str]) -> str:
    """One table of every study's headline verdicts (claim, verdict, why), from each study's results."""
    from vitscope.report.openings import VERDICT_CLASS, study_headlines

    body = []
    for name in studies:
        found = study_headlines(out / name, name)
        if found is None:
            continue
        for i, row in enumerate(found or [{"claim": "(no claim could be judged)", "verdict": "", "detail": ""}]):
            study = (f'<td rowspan="{max(len(found), 1)}"><a href="{html.escape(name)}/report.html">'
                     f"{html.escape(name)}</a></td>") if i == 0 else ""
            css = VERDICT_CLASS.get(row["verdict"], "")
            body.append(f"<tr>{study}<td>{html.escape(row['claim'])}</td><td class=\"{css}\">"
                        f"{html.escape(row['verdict'])}</td><td>{html.escape(row['detail'])}</td></tr>")
    if not body:
        return ""
    return ("<h2>Headline verdicts</h2><table><tr><th>study</th><th>claim</th><th>verdict</th><th>why</th></tr>"
            + "".join(body) + "</table>")


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
            f"</head><body><h1>vitscope demos</h1><ul>{''.join(items)}</ul>{verdict_table(out, studies)}</body></html>")
    return atomic_write_bytes(out / "index.html", page.encode())
