"""How the registers report words its verdicts: each claim of seed 004 with the verdict, the estimate and interval,
the family, the scope and (where readings disagree) the readings note; and the opening's sentences on what this run
can and cannot test. The verdicts themselves come from ``vitscope.studies.registers.verdicts`` (typed
``Judgement`` objects); nothing here decides one."""

from __future__ import annotations

import html
from typing import Any

from vitscope.claims import Judgement, claim
from vitscope.metrics.high_norm import MAX_FRACTION, MIN_GAP, MIN_RATIO
from vitscope.metrics.norms import MIN_COUNT, MIN_FRACTION
from vitscope.studies.registers.measured import LARGE_PARAMETERS, model_groups
from vitscope.studies.registers.verdicts import FAMILY_NAMES, MIN_FAMILIES, MIN_HELD_OUT

CSS = {"reproduced": "reproduced", "not reproduced": "not", "inconclusive": "inconclusive",
       "not testable": "untested", "not judged": "untested"}
ARTIFACT_TEST = (f"the split at the largest gap in the upper tail of a layer's log patch-token norms leaves between "
                 f"{MIN_FRACTION:.1%} (and {MIN_COUNT} tokens) and {MAX_FRACTION:.0%} of patches above an empty gap of "
                 f"at least {MIN_GAP:g} interquartile range of the log norms, at {MIN_RATIO:g}x the median norm or "
                 "more")


def _item(j: Judgement) -> str:
    c = claim(j.claim_id)
    family = f" [{FAMILY_NAMES[j.family]}]" if j.family else ""
    compared = f"{j.a} - {j.b}" if j.a and j.b else j.a
    parts = [f"<b>{html.escape(j.claim_id)}</b>{html.escape(family)} "
             f"<span class='{CSS.get(j.verdict, 'untested')}'>{html.escape(j.verdict)}</span>: "
             f"{html.escape(j.statement)}.",
             f"<br><i>The seed:</i> {html.escape(c.seed_words)}"]
    measured = "; ".join(p for p in (j.interval_text(), j.size) if p)
    if measured:
        where = f" at layer {j.layer}" if j.layer is not None else ""
        method = f", {j.method}" if j.method and j.method != "none" else ""
        parts.append(f"<br><i>Measured</i> ({html.escape(j.measure or c.measure)}, {html.escape(compared)}{where}, "
                     f"{j.n_a} vs {j.n_b} {html.escape(j.unit)}{html.escape(method)}): {html.escape(measured)}.")
    parts.append(f"<br><i>Why:</i> {html.escape(j.reason)}." + (f" {html.escape(j.power)}." if j.power else ""))
    if j.readings_note:
        parts.append(f"<br><i>Readings:</i> {html.escape(j.readings_note)}")
    if j.scope:
        parts.append(f"<br><i>Holds for:</i> {html.escape(j.scope)}.")
    return "<li>" + "".join(parts) + "</li>"


def claims_section(claims: list[Judgement]) -> str:
    """Every claim with its verdict (registry order), then the rules the verdicts follow, in plain words."""
    rules = (f"<p>How these verdicts are reached (vitscope's rules: the seed gives no number, no test and no "
             f"threshold). A model has high-norm tokens at a layer when that layer's own norms have a separate mode: "
             f"{html.escape(ARTIFACT_TEST)}. Planted and randomly initialised models are never evidence. R1 and R2 "
             f"are censuses of the models measured here (small: under {LARGE_PARAMETERS / 1e6:.0f}M parameters, "
             f"vitscope's line). A verdict that rests on absence (R1 not reproduced, R2 reproduced) needs pretrained "
             f"models given with their weights, for R1 of {MIN_FAMILIES} or more families: models trained here show "
             "nothing about the paper's by growing none. Each family is judged by its own claim's direction (a "
             "plain ViT's high-norm tokens lose their patch, Swin's keep its texture, PVT's keep position), never "
             "another family's. "
             "Comparisons of high-norm and normal tokens use the one rule of every study "
             "(<code>vitscope.stats</code>): a 95 % interval that resamples images, never tokens, at each model's "
             f"deepest layer with a separate mode, with at least {MIN_HELD_OUT} held-out tokens per group; a "
             "direction claim is reproduced when the interval excludes zero the paper's way, not reproduced when it "
             "excludes zero the other way. Equivalence claims (R7, R9) use two one-sided tests within the margin "
             "the registry states. R6 and R7 need the model without registers to have had a separate mode.</p>")
    return "<ul>" + "".join(_item(j) for j in claims) + "</ul>" + rules


def scale_sentences(results: Any) -> tuple[str, str]:
    """What this run can test, and what it cannot, for the generic opening (``report.openings.opening``):
    ``results`` is the ``RegistersResults`` of the run."""
    models = results.models
    groups = model_groups(models)
    given, trained, random = groups["given"], groups["trained"], groups["random"]
    kinds = [f"{', '.join(given)} with the weights given" if given else "",
             f"{', '.join(trained)} trained here" if trained else "",
             f"{', '.join(random)} with random weights (they show that the census runs on each architecture, not "
             "findings)" if random else "",
             "a model with planted outliers whose answer is known" if groups["planted"] else ""]
    count = f"{len(models)} model" + ("s" if len(models) != 1 else "")
    scale = (f"This run measures {count} on {html.escape(results.dataset)}: "
             + html.escape("; ".join(k for k in kinds if k)) + ". At this scale it can test the detector, the census "
             "and the probes" + (", and whether the given models have high-norm tokens in a separate mode and what "
                                 "those tokens carry" if given else "")
             + (", and whether small models trained here grow them (the seed says some smaller models do, depending "
                "on the architecture)" if trained else "") + ";")
    cannot = ("it cannot test the claims on the pretrained models the paper measured (which ones the seed does not "
              "say), which need their weights." if not given else
              "its verdicts rest on the models given alone, not on the paper's whole set of architectures and sizes.")
    return scale, cannot
