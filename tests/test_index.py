"""index.html: one table with every study's headline verdicts, and every report's link back to it."""

import json

from vitscope.report import openings
from vitscope.report.html import index_link
from vitscope.report.index import write_index

STUDIES = {"locality": "Locality", "sparse": "Sparse", "registers": "Registers"}


def test_index_lists_every_claim_of_every_study_with_its_verdict(tmp_path, monkeypatch):
    claims = {
        "locality": [{"claim": "cutmix", "paper": "CutMix makes early layers local", "verdict": "inconclusive",
                      "reason": "2 seeds per side"},
                     {"claim": "same", "paper": None, "verdict": "no paper claim"}],
        "sparse": [{"condition": "entmax15", "measure": "linear_top1", "what": "image linear-probe top-1",
                    "predicted": "higher", "verdict": "not reproduced", "reason": "interval below the threshold"}],
        "registers": [{"finding": "exist", "published": "Small models do not grow artifacts",
                       "verdict": "reproduced", "evidence": "no small model has artifacts", "agrees": "agrees"}],
    }
    monkeypatch.setattr(openings, "CLAIMS", {name: (lambda results, name=name: claims[name]) for name in STUDIES})
    for name in STUDIES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({}))
        (tmp_path / name / "report.html").write_text("<html></html>")
    page = write_index(tmp_path, STUDIES).read_text()
    table = page[page.index("Headline verdicts"):]
    for text in ("CutMix makes early layers local", "entmax15 vs softmax: image linear-probe top-1 (paper: higher)",
                 "Small models do not grow artifacts", "inconclusive", "not reproduced", "reproduced",
                 "2 seeds per side", "agreement with the paper: agrees"):
        assert text in table, text
    assert "no paper claim" not in table  # shown in the study's report, not a claim of the paper
    assert all(f'href="{name}/report.html"' in table for name in STUDIES)
    assert index_link(tmp_path / "sparse") and not index_link(tmp_path / "sparse" / "elsewhere")


def test_index_says_when_a_results_file_cannot_be_read(tmp_path):
    (tmp_path / "sparse").mkdir()
    (tmp_path / "sparse" / "results.json").write_text(json.dumps({"claims": [{"no": "verdict"}]}))
    (tmp_path / "locality").mkdir()
    (tmp_path / "locality" / "results.json").write_text(json.dumps({"runs": []}))
    page = write_index(tmp_path, STUDIES).read_text()
    assert "no claim could be judged" in page and "results not readable by this version" in page
