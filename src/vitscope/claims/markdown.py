"""``docs/claims.md``, generated from the registry and the verdicts stored beside the results pages.

Every results page ``docs/results/NAME.md`` may keep the verdicts it reports in ``docs/results/NAME/claims.json``
(a list of ``Judgement.to_json()`` entries, each with its ``scope``). The page lists every claim of the three
seeds: the paper's value and setting, the kind of test, what vitscope measures and how it differs, and each place
it has been tested with the verdict there. Regenerate it with ``python -m vitscope.claims.markdown`` from the
repository root; ``tests/test_claims_page.py`` fails when it is stale.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vitscope.atomic_io import atomic_write_bytes
from vitscope.claims import REGISTRY, STUDIES, Claim, Judgement

TITLES = {"locality": "Locality: seed 000, arXiv 2605.16390 (the training protocol and spatial locality)",
          "sparse": "Sparse attention: seed 001, arXiv 2605.23868 (entmax-1.5 against semantic diffusion)",
          "registers": "Registers: seed 004, arXiv 2603.25803 (high-norm tokens across architectures)"}
KIND_WORDS = {"difference": "a difference with the paper's effect", "separation": "a separation of two groups",
              "direction": "a direction (no size given)", "equivalence": "equivalence (two one-sided tests)",
              "census": "a census of models", "qualitative": "qualitative (not judged)"}


def stored_verdicts(results_dir: Path) -> dict[str, list[tuple[str, Judgement]]]:
    """claim id -> [(results page name, judgement)] from every ``results_dir/NAME/claims.json``."""
    found: dict[str, list[tuple[str, Judgement]]] = {}
    for path in sorted(Path(results_dir).glob("*/claims.json")):
        for entry in json.loads(path.read_text()):
            judgement = Judgement.from_json(entry)
            found.setdefault(judgement.claim_id, []).append((path.parent.name, judgement))
    return found


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _tested(entries: Sequence[tuple[str, Judgement]]) -> str:
    if not entries:
        return "not tested yet"
    shown = []
    for page, j in entries:
        where = f"[{page}](results/{page}.md)"
        layer = f" layer {j.layer}" if j.layer is not None else ""
        estimate = f", {j.interval_text()}" if j.interval_text() else ""
        scope = f" ({j.scope})" if j.scope else ""
        shown.append(f"{where}{layer}: **{j.verdict}**{estimate}{scope}")
    return "<br>".join(shown)


def render(tested: Mapping[str, Sequence[tuple[str, Judgement]]], registry: Mapping[str, Claim] = REGISTRY) -> str:
    """The whole page, from the registry and the stored verdicts (``stored_verdicts``)."""
    lines = ["# The seeds' claims and where vitscope stands on each", "",
             "Generated from the claims registry (`src/vitscope/claims/`) and the verdicts stored beside the results "
             "pages (`docs/results/*/claims.json`) by `python -m vitscope.claims.markdown`; do not edit by hand. "
             "Each claim is quoted from its seed in our English, with the paper's value and the setting it was "
             "measured in; a verdict holds only for the model, data and sample named beside it. The decision rule is "
             "`vitscope.stats` (docs/definitions.md, 'Claims and verdicts').", ""]
    for study in STUDIES:
        claims = [c for c in registry.values() if c.study == study]
        lines += [f"## {TITLES[study]}", "",
                  "| id | claim | the seed says | paper's value and setting | test | vitscope measures (and differs) "
                  "| tested and verdict |", "|---|---|---|---|---|---|---|"]
        for c in claims:
            test = KIND_WORDS[c.test.kind]
            if c.test.margin is not None:
                test += f", margin ±{c.test.margin:g} {c.test.unit} ({c.test.margin_why})"
            setting = "; ".join(p for p in (c.paper.describe(), c.paper.scale) if p)
            family = f" [{c.family}]" if c.family else ""
            lines.append("| " + " | ".join(_cell(x) for x in (
                c.id + family, c.statement, c.seed_words, setting, test, c.vitscope or "-",
                _tested(tested.get(c.id, ())))) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``docs/claims.md`` from ``docs/results`` (run from the repository root), or print it with ``-``."""
    args = list(sys.argv[1:] if argv is None else argv)
    target = args[0] if args else "docs/claims.md"
    page = render(stored_verdicts(Path("docs/results")))
    if target == "-":
        print(page)
    else:
        atomic_write_bytes(target, (page + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
