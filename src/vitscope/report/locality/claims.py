"""The locality report's claims sections, from the study's judged registry claims (``LocalityResults.claims``):
each claim once with its verdict, interval, size beside the paper's, scope and readings note; a table of the
same; the readings the seed leaves open; and the qualitative claims with what vitscope offers for them."""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from vitscope.claims import Judgement
from vitscope.report.html import table
from vitscope.studies.locality.results import LocalityResults
from vitscope.studies.locality.verdicts import LOCAL_MARGIN

MEASURES = {"min_early_mad": "minimum early-layer MAD", "early_entropy": "mean early-layer entropy",
            "accuracy": "top-1 accuracy"}


def _e(text: Any) -> str:
    return html.escape(str(text))


def _bounds(j: Judgement) -> str:
    """A separation's condition means against the paper's bounds (which depend on its unstated MAD reading)."""
    bounds = j.details.get("bounds")
    if not bounds:
        return ""
    shown = ", ".join(f"{c} {v:.3f}" for c, v in {**bounds["means_a"], **bounds["means_b"]}.items())
    held = ("both hold" if bounds["a_within_upper"] and bounds["b_within_lower"] else
            "the CutMix bound holds" if bounds["a_within_upper"] else
            "the bound without CutMix holds" if bounds["b_within_lower"] else "neither holds")
    return (f" Condition means: {_e(shown)}; against the paper's bounds (with CutMix &le; {bounds['upper']:g}, "
            f"without &ge; {bounds['lower']:g}): {held}.")


def verdict_item(j: Judgement) -> str:
    """One claim's entry: the verdict, id and statement; then, a line each, ours (interval and size beside the
    paper's), the paper's value and setting, the scale this verdict holds for, why (and the power line), and the
    readings the seed leaves open."""
    css = j.verdict.replace(" ", "-")
    compared = f"{_e(j.a)} against {_e(j.b)}" if j.b else _e(j.a)
    lines = [f'<b class="{css}">{_e(j.verdict.capitalize())}</b> <b>{_e(j.claim_id)}</b>: {_e(j.statement)}.']
    if j.interval_text():
        size = f"; {_e(j.size)}" if j.size else ""
        lines.append(f"<i>Ours</i> ({MEASURES.get(j.measure, _e(j.measure))}, {compared}): "
                     f"{_e(j.interval_text())}{size}.{_bounds(j)}")
    lines.append(f"<i>Paper</i>: {_e(j.paper)}.")
    if j.scope:
        lines.append(f"<i>Scale of this verdict</i>: {_e(j.scope)}.")
    lines.append(f"<i>Why</i>: {_e(j.reason)}.{' Power: ' + _e(j.power) + '.' if j.power else ''}")
    if j.readings_note:
        lines.append(f"<i>Readings</i>: <b>{_e(j.readings_note)}</b>")
    elif j.readings:
        lines.append(f"<i>Readings</i>: the others agree ({_e('; '.join(r.name for r in j.readings))}).")
    if j.details.get("unread"):
        lines.append(f"<i>Not read</i>: {_e(j.details['unread'])}.")
    return "<li>" + "<br>".join(lines) + "</li>"


def verdicts(results: LocalityResults, uniform_note: str) -> str:
    """The judged claims, one line each, then the rule in words."""
    judged = results.judged()
    tested = [j for j in judged if j.interval_text()]
    lines = "".join(verdict_item(j) for j in judged)
    rule = ("<p>Verdicts (one rule for every study, <code>vitscope.stats</code>; the unit is the seed): "
            "<b>reproduced</b> when the 95% interval excludes zero in the paper's direction and the difference "
            "reaches half the paper's effect (a claim of direction: excludes zero; an equivalence: the 90% interval "
            "lies within the margin; a separation: every pair of conditions separates by half the paper's gap); "
            "<b>not reproduced</b> when the whole interval lies below half the paper's effect (an equivalence: the "
            "95% interval lies wholly outside the margin); <b>inconclusive</b> otherwise, and always with fewer "
            "than 2 seeds per side; <b>not testable</b> when the claim's conditions are not in this study, or when "
            "its precondition fails at this scale (for the MAD and entropy claims: no condition's mean minimum "
            f"early-layer MAD lies at least {LOCAL_MARGIN:g} below uniform attention's on this grid, so no "
            "locality effect can show). Each verdict uses the stated reading (MAD over patch keys, CLS excluded "
            "and rows renormalised; early layers as named above); the readings the seed leaves open are judged "
            "the same way beside it.</p>")
    none = "" if tested else "<p>None of the paper's claims could be measured with these conditions.</p>"
    return f"<ul>{lines}</ul>{none}{uniform_note}{rule}"


def claims_table(results: LocalityResults) -> str:
    """Every claim measured here in one table (those whose conditions the study lacks are in the list above): the
    test, what was compared, the estimate and interval, the verdict, the size beside the paper's, the power line."""
    rows = [{"claim": j.claim_id, "test": j.kind, "measure": j.measure, "compared": f"{j.a} - {j.b}" if j.b else j.a,
             "difference": j.difference, "interval low": j.ci95_low, "interval high": j.ci95_high,
             "n": f"{j.n_a} vs {j.n_b} {j.unit}" if j.n_a else "", "method": j.method, "verdict": j.verdict,
             "size beside the paper's": j.size or None, "power": j.power or None}
            for j in results.judged() if j.difference is not None]
    return table(rows) if rows else "<p>(no claim had its conditions in this study)</p>"


def readings_table(results: LocalityResults) -> str:
    """Each judged claim under every reading the seed leaves open, the stated one first."""
    rows = []
    for j in results.judged():
        if not j.readings:
            continue
        stated = j.details.get("reading", {})
        rows.append({"claim": j.claim_id, "reading": f"stated: {stated.get('mad', '')}, early = "
                                                     f"{stated.get('early', '')}",
                     "difference": j.difference, "interval low": j.ci95_low, "interval high": j.ci95_high,
                     "verdict": j.verdict})
        rows += [{"claim": j.claim_id, "reading": r.name, "difference": r.difference, "interval low": r.ci95_low,
                  "interval high": r.ci95_high, "verdict": r.verdict} for r in j.readings]
    unread = next((j.details["unread"] for j in results.judged() if j.details.get("unread")), "")
    note = f"<p class='note'>{_e(unread)}.</p>" if unread else ""
    return (table(rows) if rows else "<p>(no claim was judged under another reading)</p>") + note


def qualitative(results: LocalityResults) -> str:
    """The claims no statistic judges, with what vitscope offers for each."""
    items = [f"<li><b>{_e(j.claim_id)}</b>: {_e(j.statement)}. vitscope: {_e(j.reason)}.</li>"
             for j in results.claims if not j.judged]
    return f"<ul>{''.join(items)}</ul>" if items else ""


def min_early(run_mad: list[list[float]] | None, early: list[int]) -> float | None:
    """The smallest head value of ``early`` layers of a (layers, heads) list; None when not recorded."""
    if not run_mad:
        return None
    return float(np.nanmin(np.asarray(run_mad, dtype=float)[early]))
