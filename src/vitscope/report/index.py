"""``index.html``: one page linking the reports of the studies found in a folder (written by ``vitscope demo``;
rendered from ``templates/index.html``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitscope.atomic_io import atomic_write_bytes
from vitscope.report.render import render

EXPLORER = ("explorer/explorer.html", "Attention explorer: the sparse demo's backbones before and after training, "
            "softmax vs entmax-1.5 (click a patch)")


def verdict_rows(out: Path, studies: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every study's headline verdicts, from each study's results: ``[{name, rows: [{claim, verdict, css,
    detail}]}]`` (a study with results but no judgeable claim gets one row saying so)."""
    from vitscope.report.openings import VERDICT_CLASS, study_headlines

    found_all = []
    for name in studies:
        found = study_headlines(out / name, name)
        if found is None:
            continue
        rows = found or [{"claim": "(no claim could be judged)", "verdict": "", "detail": ""}]
        found_all.append({"name": name, "rows": [{**row, "css": VERDICT_CLASS.get(row["verdict"], "")}
                                                 for row in rows]})
    return found_all


def write_index(out: str | Path, studies: Mapping[str, str]) -> Path:
    """Write ``out/index.html`` (``templates/index.html``) with a link to ``out/<name>/report.html`` for each study
    (name -> title) whose report exists, the studies not run yet, the explorer page when it exists, and the
    headline verdicts; returns its path."""
    out = Path(out)
    listed = []
    for name, title in studies.items():
        report = out / name / "report.html"
        when = (dt.datetime.fromtimestamp(report.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
                if report.is_file() else None)
        listed.append({"name": name, "title": title, "when": when})
    explorer = {"href": EXPLORER[0], "title": EXPLORER[1]} if (out / EXPLORER[0]).is_file() else None
    page = render("index.html", title="vitscope demos", studies=listed, explorer=explorer,
                  verdicts=verdict_rows(out, studies))
    return atomic_write_bytes(out / "index.html", page)
