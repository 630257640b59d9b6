"""What each study report opens with, and what ``index.html`` shows of it: the headline verdicts (one per
claim) and one paragraph in plain words (what this scale can and cannot test, which claims were tested,
what was found, the command that runs the study at paper scale and its estimated time on one GPU).

Every study's claims come out as ``{"study", "claim", "verdict", "detail"}`` rows (``headlines``), whatever
the shape of its results file, so that the index can show the three studies in one table.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitscope.claims import Judgement
from vitscope.studies.locality.presets import PAPER_SCALE as LOCALITY_SCALE
from vitscope.studies.models import loads_random_weights
from vitscope.studies.registers.presets import PAPER_SCALE as REGISTERS_SCALE
from vitscope.studies.sparse.presets import PAPER_SCALE as SPARSE_SCALE

# The paper-scale command of each study and our estimate of its time, owned by the study's presets; every estimate
# names its machine (tests/test_report_locality.py checks it).
PAPER_SCALE = {"locality": LOCALITY_SCALE, "sparse": SPARSE_SCALE, "registers": REGISTERS_SCALE}
VERDICT_CLASS = {"reproduced": "reproduced", "not reproduced": "not", "inconclusive": "untested",
                 "not testable": "untested"}
_LEGACY_VERDICTS = {"mixed": "inconclusive"}  # results written before the claims registry
_LEGACY_UNJUDGED = ("no claim", "no paper claim", "not judged")


def _text(claim: dict[str, Any]) -> str:
    if claim.get("condition") and claim.get("measure"):  # the sparse study: one row per condition and measure
        predicted = f" (paper: {claim['predicted']})" \
            if claim.get("predicted") not in (None, "none") else ""
        return f"{claim['condition']} vs softmax: {claim.get('what') or claim['measure']}{predicted}"
    for key in ("paper", "published", "claim", "sentence", "finding"):
        if claim.get(key):
            return str(claim[key])
    return str(claim.get("measure", "claim"))


def _detail(claim: dict[str, Any]) -> str:
    """Why the verdict: the rule's reason (and power line), or the evidence; whether it agrees with the paper."""
    parts = [str(claim[k]) for k in ("reason", "power", "evidence") if claim.get(k)]
    if not parts and claim.get("sentence") and claim["sentence"] != _text(claim):
        parts.append(str(claim["sentence"]))
    if claim.get("agrees"):
        parts.append(f"agreement with the paper: {claim['agrees']}")
    return "; ".join(parts)


def as_judgement(study: str, claim: Judgement | dict[str, Any]) -> Judgement | None:
    """A claim of a study's results as a ``Judgement``: a registry claim's own (it has a ``claim_id``), or a
    results file written before the registry read as one (None for its rows that were never claims)."""
    if isinstance(claim, Judgement):
        return claim
    if "claim_id" in claim:
        return Judgement.from_json(claim)
    found = claim.get("verdict")
    if not found or found in _LEGACY_UNJUDGED:
        return None
    return Judgement("", study, _text(claim), "difference", _LEGACY_VERDICTS.get(found, found), _detail(claim))


def rows(study: str, claims: list[Judgement | dict[str, Any]]) -> list[dict[str, Any]]:
    """The judged claims as index rows: {study, claim, verdict, detail} (qualitative claims left out)."""
    judged = [j for j in (as_judgement(study, c) for c in claims) if j is not None and j.judged]
    return [{"study": study, "id": j.claim_id, "claim": (f"{j.claim_id}: " if j.claim_id else "") + j.statement
             + (f" (layer {j.layer})" if j.layer is not None else ""),
             "verdict": j.verdict, "detail": "; ".join(p for p in (j.interval_text(), j.size, j.reason, j.power,
                                                                   j.readings_note, j.scope) if p)}
            for j in judged]


def locality_claims(results: dict[str, Any]) -> list[Judgement]:
    """The locality study's judged registry claims (a file written before the registry is judged again from its
    runs)."""
    from vitscope.studies.locality.results import read_results

    return read_results(results).claims


def sparse_claims(results: dict[str, Any]) -> list[Judgement]:
    from vitscope.studies.sparse.results_file import SparseResults

    return SparseResults.coerce(results).claims


def registers_claims(results: dict[str, Any]) -> list[Judgement]:
    from vitscope.studies.registers.results import RegistersResults

    return RegistersResults.from_json(results).claims


CLAIMS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "locality": locality_claims, "sparse": sparse_claims, "registers": registers_claims}


def headlines(study: str, results: dict[str, Any]) -> list[dict[str, Any]]:
    """The study's claims and verdicts as index rows; a results file this version cannot read gives one row
    that says so rather than failing the index."""
    try:
        return rows(study, CLAIMS[study](results))
    except (KeyError, TypeError, ValueError) as err:
        return [{"study": study, "claim": "(results not readable by this version)", "verdict": "",
                 "detail": f"{type(err).__name__}: {err}"}]


def study_headlines(folder: str | Path, study: str) -> list[dict[str, Any]] | None:
    """``headlines`` of the study whose results are in ``folder`` (None when it has no results yet)."""
    file = Path(folder) / "results.json"
    if not file.is_file():
        return None
    return headlines(study, json.loads(file.read_text()))


def _claims_list(found: list[dict[str, Any]]) -> str:
    """The claims tested, counted by verdict with their ids: '2 reproduced (L2, L4); 1 inconclusive (L6-cutmix)'
    (a claim without an id, from an older results file, by its words)."""
    groups: dict[str, list[str]] = {}
    for row in found:
        groups.setdefault(row["verdict"], []).append(row.get("id") or row["claim"])
    return "; ".join(f"{len(names)} <b>{html.escape(v)}</b> ({', '.join(html.escape(n) for n in names)})"
                     for v, names in groups.items())


def opening(study: str, results: dict[str, Any], scale: str, cannot: str) -> str:
    """One paragraph in plain words: what ``scale`` can test and what it ``cannot``, the claims tested and their
    verdicts, and the paper-scale command with its estimated time on the machine it names."""
    found = headlines(study, results)
    command, cost = PAPER_SCALE[study]
    tested = f" It judged {len(found)} claim{'s' if len(found) != 1 else ''}: {_claims_list(found)}." \
        if found else " No claim of the paper could be judged with these runs."
    return (f'<p class="opening"><b>In short.</b> {scale} {cannot}{tested} '
            f"To run the same study at paper scale: <code>{html.escape(command)}</code> ({html.escape(cost)}).</p>")


def _seeds(results: dict[str, Any]) -> int:
    runs = results.get("runs") or []
    per: dict[Any, set] = {}
    for r in runs:
        per.setdefault(r.get("condition"), set()).add(r.get("seed"))
    return min((len(s) for s in per.values()), default=0)


def locality_opening(results: dict[str, Any]) -> str:
    """The locality report's opening: what this run's model, schedule and data can test, and what they cannot."""
    from vitscope.studies.locality.results import read_results
    from vitscope.studies.locality.scope import DATASETS, PAPER_MODEL

    typed = read_results(results)
    seeds = _seeds({"runs": [r.to_json() for r in typed.runs]})
    config = typed.runs[0].train_config
    model, dataset = str(config["model"]), typed.dataset
    epochs = f"{config['epochs']} epoch{'s' if config['epochs'] != 1 else ''}"
    scale = (f"This run trains <code>{html.escape(model)}</code> for {epochs} on "
             f"{html.escape(DATASETS.get(dataset, dataset))} with {seeds} seed(s) per condition. "
             "At this scale it can test whether the training protocol moves the early layers' attention distance "
             "and entropy in a small ViT, with a verdict from seeds;")
    if model == PAPER_MODEL and dataset == "cifar100":
        cannot = ("it runs the paper's model and data, but with vitscope's own schedule (the seed states no "
                  "epochs, optimiser or batch size) and several seeds where the paper ran one.")
    else:
        cannot = ("it cannot test the paper's CIFAR-100 effect sizes or its accuracy gains, which need the paper's "
                  "compact ViT on CIFAR-100 (vitscope's paper preset: vit-compact, with its own 200-epoch schedule, "
                  "since the seed states none).")
    return opening("locality", results, scale, cannot)


def sparse_opening(results: Any) -> str:
    """The sparse report's opening: what was compared, at what scale, what that can test; the paper's effect
    sizes from the registry."""
    from vitscope.claims import claim
    from vitscope.studies.sparse.results_file import SparseResults

    results = SparseResults.coerce(results)
    trained = [r["source"]["trained"] for r in results.runs if "trained" in r.get("source", {})]
    given = {r["condition"]: r["source"]["given"] for r in results.runs if "given" in r.get("source", {})}
    named = ", ".join(f"{label} ({'random weights' if loads_random_weights(entry) else 'the weights given'})"
                      for label, entry in given.items())
    what = f"the given models {html.escape(named)}"
    if trained:
        epochs = trained[0]["epochs"]
        what = (f"<code>{html.escape(str(trained[0]['model']))}</code> pretrained with DINO for {epochs} "
                f"epoch{'s' if epochs != 1 else ''} on {html.escape(str(trained[0]['dataset']))}"
                + (f", beside the given models {html.escape(named)}" if given else ""))
    conditions = html.escape(", ".join(results.conditions()))
    scale = (f"This run ({html.escape(str(results.settings.get('preset')))} preset) compares {what}, differing "
             f"only in the attention normaliser, registers or CLS/patch Specialization ({conditions}), with "
             f"{results.seeds_per_condition()} seed(s) per condition. At this scale it can test whether "
             "entmax-1.5 gives attention exact zeros and in which direction it moves the probes of a small "
             "backbone;")
    linear, voc = claim("S4"), claim("S5")
    cannot = (f"it cannot test the paper's ImageNet effect sizes ({100 * linear.test.effect:+.2f} points of linear "
              f"top-1, {voc.test.effect:+.2f} mIoU on VOC), which need {linear.paper.model} with "
              f"{linear.paper.scale}: each verdict below says how its effect compares in size.")
    return opening("sparse", results.to_json(), scale, cannot)


def registers_opening(results: dict[str, Any]) -> str:
    """The registers report's opening: which models were measured (pretrained as given, trained here, random or
    planted) and what that lets this run test (``vitscope.report.registers.claims.scale_sentences``)."""
    from vitscope.report.registers.claims import scale_sentences
    from vitscope.studies.registers.results import RegistersResults

    return opening("registers", results, *scale_sentences(RegistersResults.from_json(results)))
