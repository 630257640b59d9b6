"""docs/claims.md is generated from the registry and the stored verdicts: it fails when the page is stale."""

from pathlib import Path

from vitscope.claims import REGISTRY
from vitscope.claims.markdown import render, stored_verdicts

ROOT = Path(__file__).resolve().parents[1]


def test_claims_page_is_current():
    page = render(stored_verdicts(ROOT / "docs" / "results"))
    for cid in REGISTRY:
        assert f"| {cid}" in page
    assert (ROOT / "docs" / "claims.md").read_text() == page + "\n", (
        "docs/claims.md is stale: regenerate it with `python -m vitscope.claims.markdown` from the repository root")
