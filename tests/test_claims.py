"""The claims registry and the kinds of test that judge it, against known answers (issue 43)."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from vitscope.claims import REGISTRY, Judgement, claim, claims_of
from vitscope.claims.judge import judge, judge_census, judge_separation, not_judged, size_words
from vitscope.claims.registry import Claim, ClaimTest, Paper
from vitscope.stats import Precondition

SEED_CLAIMS = Path(__file__).resolve().parents[1].parent / "shared" / "SEED-CLAIMS.md"
RNG = np.random.default_rng(0)


def seeds(mean: float, sd: float = 0.005, n: int = 3) -> list[float]:
    return list(mean + sd * RNG.standard_normal(n))


@pytest.mark.skipif(not SEED_CLAIMS.exists(), reason="../shared/SEED-CLAIMS.md is not present")
def test_every_row_of_the_seed_claims_table_is_in_the_registry():
    rows = set(re.findall(r"^\| ([LSR]\d+) \|", SEED_CLAIMS.read_text(), flags=re.M))
    assert len(rows) == 31
    covered = {cid.split("-")[0] for cid in REGISTRY}
    assert rows <= covered, sorted(rows - covered)


def test_registry_entries_are_whole():
    assert len({c.id for c in REGISTRY.values()}) == len(REGISTRY)
    for c in REGISTRY.values():
        assert c.statement and c.seed_words and c.paper.describe()
        if c.judged and c.test.kind != "census":
            assert c.measure and c.a and c.b, c.id
    assert [c.id for c in claims_of("locality")][:3] == ["L1", "L1-entropy", "L2"]
    with pytest.raises(KeyError, match="known: L1"):
        claim("L99")
    with pytest.raises(ValueError, match="separation needs upper < lower"):
        ClaimTest("separation", upper=0.3, lower=0.2)
    with pytest.raises(ValueError, match="a difference test needs effect"):
        ClaimTest("difference")


def test_the_papers_own_numbers_reproduce_the_headline():
    """Planted per-seed values at the paper's CIFAR-100 numbers (Modern 0.008, Baseline 0.316) reproduce L2,
    and its size reads about the paper's."""
    j = judge(claim("L2"), seeds(0.008), seeds(0.316))
    assert j.verdict == "reproduced", j.reason
    assert j.difference == pytest.approx(-0.308, abs=0.02)
    assert j.size.startswith("about the paper's effect")
    assert j.ci95_low < j.difference < j.ci95_high
    half = judge(claim("L2"), seeds(0.25), seeds(0.316))  # a tenth of the effect, clearly measured
    assert half.verdict == "not reproduced" and "% of the paper's effect" in half.size


def test_direction_claims_need_only_the_sign():
    assert judge(claim("L1"), seeds(0.30), seeds(0.40)).verdict == "reproduced"
    assert judge(claim("L1"), seeds(0.40), seeds(0.30)).verdict == "not reproduced"
    assert judge(claim("L1"), [0.35, 0.30], [0.33, 0.36]).verdict == "inconclusive"
    assert judge(claim("L1"), seeds(0.30), seeds(0.40)).size == "the paper gives a direction, not a size"


def test_a_known_constant_side_is_not_a_sample():
    """Softmax has no exact zeros by construction: entmax's fraction is compared with the known 0 (one-sample t),
    not judged inconclusive for a Welch df of about 1 (issue 46 item 18)."""
    zeros = Claim("X11", "sparse", "s", "w", Paper(), ClaimTest("direction", sign=1), measure="attention_zeros",
                  a="entmax15", b="softmax")
    j = judge(zeros, [0.32, 0.37], 0.0)
    assert j.verdict == "reproduced", j.reason
    assert j.n_b == 0 and j.values_b == [0.0]
    low, high = scipy_stats.ttest_1samp([0.32, 0.37], 0.0).confidence_interval(0.95)
    assert (j.ci95_low, j.ci95_high) == pytest.approx((low, high), rel=1e-6)


def test_equivalence_is_two_one_sided_tests_with_the_stated_margin():
    c = claim("L5-autoaugment")
    a, b = seeds(0.30, 0.004, 5), seeds(0.30, 0.004, 5)
    j = judge(c, a, b)
    assert j.kind == "equivalence" and j.verdict == "reproduced", j.reason
    margin = c.test.margin
    p_lower = scipy_stats.ttest_ind(np.array(a) + margin, b, equal_var=False, alternative="greater").pvalue
    p_upper = scipy_stats.ttest_ind(np.array(a) - margin, b, equal_var=False, alternative="less").pvalue
    assert j.details["p_lower"] == pytest.approx(p_lower, rel=1e-6)
    assert j.details["p_upper"] == pytest.approx(p_upper, rel=1e-6)
    assert "within the equivalence margin" in j.size
    assert judge(c, seeds(0.10, 0.004, 5), b).verdict == "not reproduced"


def test_separation_is_judged_on_every_pair_with_the_papers_bounds_beside():
    c = claim("L4")
    with_cutmix = {"modern": seeds(0.008, 0.002), "baseline+cutmix": seeds(0.015, 0.002)}
    without = {"baseline": seeds(0.316), "baseline+autoaugment": seeds(0.300)}
    j = judge_separation(c, with_cutmix, without)
    assert j.verdict == "reproduced", j.reason
    assert len(j.details["pairs"]) == 4
    assert j.details["bounds"]["a_within_upper"] and j.details["bounds"]["b_within_lower"]
    assert j.difference == pytest.approx(0.015 - 0.300, abs=0.02)  # the closest pair, a - b
    leaky = judge_separation(c, {**with_cutmix, "modern-autoaugment": seeds(0.290)}, without)
    assert leaky.verdict == "not reproduced" and "modern-autoaugment" in leaky.reason
    assert not leaky.details["bounds"]["a_within_upper"]
    assert judge_separation(c, with_cutmix, {}).verdict == "not testable"


def test_a_precondition_that_fails_makes_the_claim_not_testable():
    unmet = Precondition(False, "every condition attends about uniformly")
    j = judge(claim("L2"), seeds(0.40), seeds(0.41), precondition=unmet)
    assert j.verdict == "not testable" and j.reason == unmet.reason


def test_readings_that_disagree_are_said_in_one_sentence():
    j = judge(claim("L1"), seeds(0.30), seeds(0.40),
              readings={"CLS at distance 0": (seeds(0.05), seeds(0.05))})
    assert j.readings[0].verdict == "inconclusive"
    assert j.readings_note.startswith("The readings the seed leaves open disagree: with CLS at distance 0")
    agree = judge(claim("L1"), seeds(0.30), seeds(0.40), readings={"layers 1-2": (seeds(0.2), seeds(0.4))})
    assert agree.readings_note == ""


def test_census_claims():
    assert judge_census(claim("S11"), {"seed 0": True, "seed 1": True}).verdict == "reproduced"  # every run
    assert judge_census(claim("S11"), {"seed 0": True, "seed 1": False}).verdict == "not reproduced"
    assert judge_census(claim("R1"), {"vit-s": True, "vit-b": False}).verdict == "reproduced"
    assert judge_census(claim("R1"), {"vit-s": False}).verdict == "not reproduced"
    assert judge_census(claim("R2"), {"dino-s16": False, "dino-b16": False}).verdict == "reproduced"
    assert judge_census(claim("R2"), {"dino-s16": True}).verdict == "not reproduced"
    assert judge_census(claim("R2"), {}).verdict == "not testable"


def test_size_words_say_how_the_effect_compares_with_the_papers():
    c = claim("S4")  # +0.0056 top-1
    assert size_words(0.142, c).startswith("about 25 times the paper's effect (+0.142 against the paper's +0.0056")
    assert size_words(-0.01, c).startswith("the opposite sign")
    assert size_words(math.nan, c) == ""


def test_judgements_round_trip_and_refuse_a_newer_schema():
    j = judge(claim("L1"), seeds(0.30), seeds(0.40), readings={"x": (seeds(0.3), seeds(0.3))}, layer=2,
              scope="vit-micro, synthetic")
    back = Judgement.from_json(j.to_json())
    assert back == j
    assert not_judged(claim("L3")).verdict == "not judged" and not not_judged(claim("L3")).judged
    with pytest.raises(ValueError, match="newer than this vitscope reads"):
        Judgement.from_json({**j.to_json(), "schema_version": 99})
    with pytest.raises(ValueError, match="is not one of"):
        Judgement("L1", "locality", "x", "direction", "probably", "")


def test_a_claim_of_another_kind_is_refused_by_judge():
    c = Claim("X1", "locality", "s", "w", Paper(), ClaimTest("census", expect=True))
    with pytest.raises(ValueError, match="judge it with judge_census"):
        judge(c, [1.0, 2.0], [1.0, 2.0])
