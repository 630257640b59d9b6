"""A claim whose precondition fails at the run's scale reads "not testable" with the reason, never "not
reproduced": the one rule (``vitscope.stats.verdict``) through the locality, sparse and registers studies and the
demo index page."""

import json

import numpy as np
import pytest

from vitscope.metrics import uniform_mad
from vitscope.report.index import write_index
from vitscope.stats import NOT_TESTABLE, VERDICTS, Precondition, compare, verdict
from vitscope.studies.locality.results import LocalityResults
from vitscope.studies.locality.verdicts import LOCAL_MARGIN, judge_runs, locality_precondition
from vitscope.studies.sparse.judging import judge_claims as sparse_claims

UNIFORM_8X8 = uniform_mad((8, 8))  # normalised MAD of uniform attention on 8 x 8, 0.4178 (docs/definitions.md)


def test_an_unmet_precondition_overrides_the_interval():
    missed = compare([0.41, 0.412, 0.409], [0.414, 0.413, 0.415], sign=-1, threshold=0.1)
    assert missed.verdict == "not reproduced"  # what the interval alone says
    assert verdict(missed) == (missed.verdict, missed.reason)
    assert verdict(missed, Precondition(True, "some condition is local")) == (missed.verdict, missed.reason)
    assert verdict(missed, Precondition(False, "all uniform")) == (NOT_TESTABLE, "all uniform")
    assert verdict(("mixed", "holds for a"), Precondition(False, "none measured")) == (NOT_TESTABLE, "none measured")
    assert NOT_TESTABLE in VERDICTS


def test_precondition_margin_is_measured_below_uniform():
    assert locality_precondition({"a": UNIFORM_8X8 - LOCAL_MARGIN - 1e-3}, UNIFORM_8X8).met
    unmet = locality_precondition({"a": UNIFORM_8X8 - LOCAL_MARGIN + 1e-3, "b": 0.45}, UNIFORM_8X8)
    assert not unmet.met and "uniform" in unmet.reason and "0.4178" in unmet.reason
    assert not locality_precondition({"a": float("nan")}, UNIFORM_8X8).met


def run(condition, seed, early_min, accuracy):
    """One locality record on an 8 x 8 grid: 4 layers x 4 heads, the early layers' smallest head at
    ``early_min`` (a planted value), every other head at uniform attention's MAD."""
    rng = np.random.default_rng(100 * seed + len(condition))
    mad = np.full((4, 4), UNIFORM_8X8) + 1e-3 * rng.standard_normal((4, 4))
    mad[0, 1] = early_min + 1e-3 * rng.standard_normal()
    return {"condition": condition, "seed": seed, "accuracy": accuracy, "layers": [0, 1, 2, 3],
            "mad": mad.tolist(), "entropy": np.ones((4, 4)).tolist(), "grid_size": [8, 8]}


def study(cutmix_min, baseline_min):
    records = [run("baseline", s, baseline_min, 0.60 + 0.01 * s) for s in range(3)]
    records += [run("baseline+cutmix", s, cutmix_min, 0.50 + 0.01 * s) for s in range(3)]
    return records


def claim_of(found, claim_id):
    return next(j for j in found if j.claim_id == claim_id)


def test_uniform_attention_study_is_not_testable_and_accuracy_still_judged():
    found = judge_runs(study(cutmix_min=UNIFORM_8X8 - 0.01, baseline_min=UNIFORM_8X8 - 0.005), dataset="synthetic")
    mad = claim_of(found, "L4")
    assert mad.verdict == "not testable", mad.reason
    assert "attends about uniformly" in mad.reason
    assert mad.details["pairs"][0]["verdict"] == "not reproduced"  # the interval alone would have said so
    accuracy = claim_of(found, "L6-cutmix")
    assert accuracy.verdict == "not reproduced"  # CutMix costing 10 points: not a precondition matter


@pytest.mark.parametrize(("cutmix_min", "baseline_min", "expected"), [
    (0.02, 0.31, "reproduced"),  # planted local attention with CutMix, as in the paper
    (0.30, 0.31, "not reproduced"),  # learned local attention, but CutMix changes nothing
])
def test_planted_local_study_is_testable(cutmix_min, baseline_min, expected):
    mad = claim_of(judge_runs(study(cutmix_min, baseline_min), dataset="synthetic"), "L4")
    assert mad.verdict == expected, mad.reason


def test_old_results_file_is_judged_again_with_the_precondition():
    records = study(cutmix_min=UNIFORM_8X8 - 0.01, baseline_min=UNIFORM_8X8 - 0.005)
    old = [{"claim": "conditions with cutmix vs without", "measure": "min_early_mad", "verdict": "not reproduced"}]
    results = LocalityResults.from_json({"schema_version": 1, "study": "locality", "runs": records, "claims": old,
                                         "provenance": {"config": {}, "dataset": "synthetic"}})
    assert claim_of(results.claims, "L4").verdict == "not testable"


@pytest.mark.parametrize(("cutmix_min", "expected"), [(UNIFORM_8X8 - 0.01, "not testable"),
                                                      (0.02, "reproduced")])
def test_demo_index_page_shows_the_verdict(tmp_path, cutmix_min, expected):
    records = study(cutmix_min=cutmix_min, baseline_min=0.31 if expected == "reproduced" else UNIFORM_8X8)
    folder = tmp_path / "locality"
    folder.mkdir()
    results = LocalityResults(runs=records, claims=judge_runs(records, dataset="synthetic"),
                              provenance={"config": {}, "dataset": "synthetic"})
    (folder / "results.json").write_text(json.dumps(results.to_json()))
    (folder / "report.html").write_text("<html></html>")
    page = write_index(tmp_path, {"locality": "Locality"}).read_text()
    table = page[page.index("Headline verdicts"):]
    row = table[table.index("L4: CutMix alone decides locality"):]
    row = row[:row.index("</tr>")]
    assert expected in row and (expected != "not testable" or "attends about uniformly" in row)
    assert "not reproduced" not in row


def test_sparse_claim_without_measured_values_is_not_testable():
    def record(condition, seed, top1, depth=None):
        dense = [] if depth is None else [{"group": "depth:nyu", "metric": "rmse", "with_cls": True, "layer": 4,
                                           "value": depth}]
        return {"condition": condition, "seed": seed, "normaliser": condition, "depth": 4, "dense": dense,
                "probe_train_images": 8, "eval_images": 8,
                "image": {"linear_top1": top1, "knn_top1": float("nan")},
                "diffusion": {"last_layer": {"top1": 0.2, "cosine": 0.3}}, "attention": {"zeros": [0.0]}}

    records = [record("softmax", s, 0.5 + 0.01 * s, depth=float("nan")) for s in range(2)]
    records += [record("entmax15", s, 0.52 + 0.01 * s, depth=0.6) for s in range(2)]
    found = {c.claim_id: c for c in sparse_claims(records, {"preset": "demo"})}
    assert found["S9"].verdict == "not testable" and "not measured in the softmax runs" in found["S9"].reason
    assert found["S5"].verdict == "not testable" and "no VOC set" in found["S5"].reason
    assert found["S4"].verdict in ("reproduced", "not reproduced", "inconclusive")
