"""The sparse report's claims section: every claim of seed 001 with its verdict, the measured difference and its
interval, the size beside the paper's, what the seeds can detect, the run's scale beside the paper's, and the
readings note where the readings the seed leaves open disagree; then the measured differences no claim covers.
"""

from __future__ import annotations

import html
import math

from vitscope.claims import Judgement
from vitscope.report.html import table
from vitscope.report.openings import VERDICT_CLASS
from vitscope.studies.sparse.results_file import SparseResults

RULES = ("One value per seed, every seed of both sides. A difference claim is reproduced when the 95 % interval "
         "excludes zero in the paper's direction and the estimate reaches half the paper's effect, not reproduced "
         "when the whole interval lies below half of it, inconclusive otherwise (and always below 2 seeds a side); "
         "a claim of direction only (the paper ranks, it gives no size) needs the interval to exclude zero its way. "
         "A side that is known by construction (softmax's fraction of exact zeros, 0) is a known value, not a "
         "sample: the other side is tested against it (one-sample t). Claims this run cannot judge say why.")


def _item(label: str, text: str) -> str:
    return f"<li><i>{html.escape(label)}</i>: {html.escape(text)}</li>" if text else ""


def _scale(j: Judgement, run_scope: str) -> str:
    """The claim's scale: what it adds to the run's (said once above the claims), '' for a claim not judged."""
    if j.verdict in ("not testable", "not judged") or not j.scope:
        return ""
    if run_scope and j.scope.startswith(run_scope):
        return "the run's, above" + j.scope[len(run_scope):]
    return j.scope


def claim_block(j: Judgement, run_scope: str = "") -> str:
    """One claim as a paragraph and a list: the verdict first, then the evidence in plain words (``run_scope``:
    the scale every claim shares, said once above)."""
    badge = f'<b class="{VERDICT_CLASS.get(j.verdict, "untested")}">{html.escape(j.verdict)}</b>'
    head = f"<p><b>{html.escape(j.claim_id or 'claim')}</b> {html.escape(j.statement)}: {badge}</p>"
    measured = ""
    if j.interval_text():
        counts = f"{j.n_a} vs {j.n_b} {j.unit}" if j.n_b else f"{j.n_a} {j.unit}"
        measured = f"{j.a} - {j.b}: {j.interval_text()}; {counts}, {j.method}"
    power = str(j.details.get("power_sentence", "")) if j.interval_text() else ""
    readings = "; ".join(f"{r.name}: {r.verdict} ({_signed(r.difference)}, interval {_signed(r.ci95_low)} to "
                         f"{_signed(r.ci95_high)})" for r in j.readings)
    items = [_item("measured", measured), _item("size beside the paper's", j.size),
             _item("what these seeds can say", power), _item("why", j.reason),
             _item("scale", _scale(j, run_scope)), _item("the paper", j.paper),
             _item("other readings", readings), _item("readings", j.readings_note)]
    return f'<div class="claim">{head}<ul>{"".join(items)}</ul></div>'


def _signed(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:+.3g}"


def claims_section(results: SparseResults) -> str:
    """The claims, each once in the registry's order, and the rule they were judged by."""
    if not results.claims:
        return "<p>No claim was judged: no run of a condition the claims compare.</p>"
    scale = f'<p class="note"><b>Scale of every verdict below</b>: {html.escape(results.scope)}.</p>' \
        if results.scope else ""
    return f"<p>{html.escape(RULES)}</p>{scale}" + "".join(claim_block(j, results.scope) for j in results.claims)


def differences_section(results: SparseResults) -> str:
    """Every condition against softmax on every measure, with its interval and no verdict."""
    if not results.differences:
        return "<p>No softmax runs: nothing to compare against.</p>"
    rows = [{"condition": d.condition, "measure": d.what, "value": d.value, "softmax": d.baseline_value,
             "difference": d.difference, "95 % interval": f"{_signed(d.ci95_low)} to {_signed(d.ci95_high)}",
             "seeds per side": f"{d.n} vs {d.n_baseline}", "method": d.method} for d in results.differences]
    return ("<p>Each condition minus softmax on every measure the study takes, with the 95 % interval of the same "
            "estimate and no verdict: the paper makes no claim about these (vitscope's own semantic-diffusion "
            "measures, kNN, sets other than the paper's, conditions the claims do not name); the claims above are "
            "judged once each.</p>" + table(rows))
