"""The claims registry's primitives in vitscope.stats: a side known by construction, a claim of direction only, and
equivalence by two one-sided tests (checked against scipy's t-tests where scipy is installed)."""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitscope.stats import NOT_TESTABLE, Equivalence, Precondition, compare, equivalence, t_quantile, verdict


def _scipy_stats():
    return pytest.importorskip("scipy.stats")


# -- a side known by construction -----------------------------------------------------------------------------------

def test_a_known_value_is_a_one_sample_t_interval():
    entmax = np.array([0.32, 0.37, 0.35])  # fractions of exact zeros; softmax gives none, by construction
    result = compare(entmax, 0.0, sign=1, threshold=0.05)
    half = t_quantile(0.975, 2) * entmax.std(ddof=1) / math.sqrt(3)
    assert (result.low, result.high) == pytest.approx((entmax.mean() - half, entmax.mean() + half))
    assert result.method.startswith("one-sample t against the known value 0") and result.df == 2
    assert (result.n_a, result.n_b, result.known_b) == (3, 0, 0.0)
    assert "3 seeds against the known value 0" in result.describe()


def test_a_known_value_matches_scipys_one_sample_interval():
    stats = _scipy_stats()
    rng = np.random.default_rng(4)
    for n, known in [(2, 0.0), (3, 0.5), (7, -1.25)]:
        a = rng.normal(0.3, 0.2, n)
        result = compare(a, known, sign=1, threshold=0.1)
        interval = stats.ttest_1samp(a, known).confidence_interval(0.95)
        assert (result.low, result.high) == pytest.approx((interval.low - known, interval.high - known), rel=1e-9)


def test_values_that_happen_to_be_equal_stay_a_sample():
    entmax = [0.32, 0.37, 0.35]
    sampled = compare(entmax, [0.0, 0.0], sign=1, threshold=0.05)
    assert sampled.method.startswith("Welch t") and sampled.n_b == 2 and sampled.known_b is None
    assert compare(entmax, np.float64(0.0), sign=1, threshold=0.05).known_b == 0.0  # a numpy number is one number


def test_a_known_value_with_clusters_is_the_one_sample_interval_of_image_means():
    rng = np.random.default_rng(6)
    per_image, images = 3, 5
    values = np.repeat(rng.normal(0.4, 0.1, images), per_image) + rng.normal(0, 0.02, images * per_image)
    ids = np.repeat(np.arange(images), per_image)
    result = compare(values, 0.0, sign=1, threshold=0.05, clusters=ids)
    means = values.reshape(images, per_image).mean(1)
    half = t_quantile(0.975, images - 1) * means.std(ddof=1) / math.sqrt(images)
    assert (result.low, result.high) == pytest.approx((means.mean() - half, means.mean() + half))
    assert result.known_b == 0.0 and result.n_b == 0 and "against the known value 0" in result.method
    one = compare(values[:3], 0.0, sign=1, threshold=0.05, clusters=ids[:3])
    assert one.verdict == "inconclusive" and "needs >= 2 images (has 1)" in one.reason


def test_a_known_value_needs_two_seeds_and_a_finite_value():
    assert compare([0.3], 0.0, sign=1, threshold=0.05).verdict == "inconclusive"
    with pytest.raises(ValueError, match="known value b=nan"):
        compare([0.3, 0.4], float("nan"), sign=1, threshold=0.05)


# -- a claim of direction only --------------------------------------------------------------------------------------

def test_direction_only_reproduced_not_reproduced_and_inconclusive():
    up = compare([1.0, 1.1, 1.2], [0.0, 0.1, 0.05], sign=1, threshold=None)
    assert up.verdict == "reproduced" and "excludes zero" in up.reason
    down = compare([1.0, 1.1, 1.2], [0.0, 0.1, 0.05], sign=-1, threshold=None)
    assert down.verdict == "not reproduced" and "against the paper's direction" in down.reason
    unclear = compare([0.1, 0.3, -0.2], [0.0, 0.1, 0.05], sign=1, threshold=None)
    assert unclear.low < 0 < unclear.high and unclear.verdict == "inconclusive"
    # a tiny effect the threshold rule calls "not reproduced" is still an effect in the paper's direction
    tiny = ([0.50, 0.51, 0.52, 0.51], [0.40, 0.41, 0.42, 0.41])
    assert compare(*tiny, sign=1, threshold=None).verdict == "reproduced"
    assert compare(*tiny, sign=1, threshold=0.5).verdict == "not reproduced"


def test_direction_only_has_no_paper_effect_in_its_power_line():
    result = compare([1.0, 1.1, 1.2], [0.0, 0.1, 0.05], sign=1, threshold=None)
    assert result.threshold is None and result.paper_effect is None and result.seeds_needed is None
    assert "these seeds detect effects of about" in result.power_line() and "paper" not in result.power_line()
    assert result.as_dict()["paper_effect"] is None
    assert verdict(result, Precondition(False, "no locality at this scale")) == (NOT_TESTABLE,
                                                                                "no locality at this scale")


def test_a_threshold_of_zero_is_still_refused():
    with pytest.raises(ValueError, match="threshold=0"):
        compare([1, 2], [3, 4], sign=1, threshold=0)


# -- equivalence ----------------------------------------------------------------------------------------------------

samples = st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=8).filter(
    lambda v: np.std(v) > 1e-2)


@settings(max_examples=40, deadline=None)
@given(a=samples, b=samples, margin=st.floats(0.05, 4.0))
def test_equivalence_p_values_are_scipys_one_sided_welch_tests(a, b, margin):
    stats = _scipy_stats()
    result = equivalence(a, b, margin)
    lower = stats.ttest_ind(a, np.asarray(b) - margin, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(a, np.asarray(b) + margin, equal_var=False, alternative="less").pvalue
    assert (result.p_lower, result.p_upper) == pytest.approx((lower, upper), rel=1e-7, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(a=samples, margin=st.floats(0.05, 4.0), shift=st.floats(-3, 3))
def test_paired_and_known_value_equivalence_are_scipys_paired_and_one_sample_tests(a, margin, shift):
    stats = _scipy_stats()
    a = np.asarray(a)
    b = a[::-1] * 0.5 + shift
    if np.std(a - b) < 1e-2:
        return
    paired = equivalence(a, b, margin, paired=True)
    assert paired.p_lower == pytest.approx(stats.ttest_rel(a, b - margin, alternative="greater").pvalue, rel=1e-7,
                                           abs=1e-12)
    assert paired.p_upper == pytest.approx(stats.ttest_rel(a, b + margin, alternative="less").pvalue, rel=1e-7,
                                           abs=1e-12)
    known = equivalence(a, shift, margin)
    assert known.p_lower == pytest.approx(stats.ttest_1samp(a, shift - margin, alternative="greater").pvalue,
                                          rel=1e-7, abs=1e-12)
    interval = stats.ttest_1samp(a, shift).confidence_interval(0.90)  # integer df: TOST's interval, exactly
    assert (known.low, known.high) == pytest.approx((interval.low - shift, interval.high - shift), rel=1e-9)


def test_equivalence_p_values_by_hand():
    a, b = np.array([1.0, 1.2, 0.9, 1.1]), np.array([1.05, 0.95, 1.0])
    va, vb = a.var(ddof=1) / 4, b.var(ddof=1) / 3
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
    result = equivalence(a, b, 0.3)
    assert result.df == pytest.approx(df)
    d = a.mean() - b.mean()
    half = t_quantile(0.95, df) * se
    assert (result.low, result.high) == pytest.approx((d - half, d + half))
    assert result.p_lower < 0.05 and result.p_upper < 0.05 and result.verdict == "reproduced"
    assert "equivalence shown" in result.reason

    def upper_tail(t):  # Student's t density integrated numerically: independent of the incomplete beta used
        log_norm = mpmath.loggamma((df + 1) / 2) - mpmath.loggamma(df / 2) - mpmath.log(df * mpmath.pi) / 2
        return float(mpmath.quad(lambda x: mpmath.exp(log_norm - (df + 1) / 2 * mpmath.log1p(x * x / df)),
                                 [t, mpmath.inf]))
    assert result.p_lower == pytest.approx(upper_tail((d + 0.3) / se), rel=1e-8)
    assert result.p_upper == pytest.approx(upper_tail((0.3 - d) / se), rel=1e-8)


def test_equivalence_verdicts():
    close = equivalence([1.0, 1.02, 0.99, 1.01, 1.0], [1.0, 1.01, 0.99, 1.0, 1.02], 0.1)
    assert close.verdict == "reproduced" and -0.1 < close.low < close.high < 0.1
    apart = equivalence([2.0, 2.1, 2.05], [1.0, 1.05, 0.98], 0.2)
    assert apart.verdict == "not reproduced" and apart.low95 > 0.2 and "larger than the margin" in apart.reason
    wide = equivalence([1.0, 2.0], [0.5, 1.9], 0.2)
    assert wide.verdict == "inconclusive" and "neither" in wide.reason
    one = equivalence([1.0], [1.0, 1.1], 0.2)
    assert one.verdict == "inconclusive" and "needs >= 2 seeds per side" in one.reason and math.isnan(one.p_lower)
    flat = equivalence([1.0, 1.0], [1.0, 1.0], 0.2)
    assert flat.verdict == "inconclusive" and "no spread" in flat.reason
    assert isinstance(close, Equivalence) and "margin ±0.1" in close.describe()


def test_equivalence_goes_through_verdict_with_a_precondition():
    close = equivalence([1.0, 1.02, 0.99, 1.01], [1.0, 1.01, 0.99, 1.0], 0.1)
    assert verdict(close) == ("reproduced", close.reason)
    assert verdict(close, Precondition(False, "accuracy at chance")) == (NOT_TESTABLE, "accuracy at chance")
    assert verdict(close, Precondition(True, "fine"))[0] == "reproduced"


def test_equivalence_at_the_margin_is_shown_at_most_five_percent_of_the_time():
    """TOST's size: with the true difference exactly at the margin, equivalence is (wrongly) shown at most 5 % of
    the time (it is conservative at few seeds). A rule at p < 0.10, or on a 95 % two-sided test of zero, fails."""
    rng = np.random.default_rng(9)
    trials = 1500
    shown = sum(equivalence(rng.normal(0.5, 0.3, 4), rng.normal(0.0, 0.3, 4), 0.5).verdict == "reproduced"
                for _ in range(trials))
    assert shown / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_equivalence_uses_compares_interval_for_every_design():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 30), rng.normal(0.1, 1, 24)
    ids_a, ids_b = np.repeat(np.arange(6), 5), np.repeat(np.arange(6, 12), 4)
    for kwargs in ({}, {"clusters": (ids_a, ids_b)}):
        eq, cmp = equivalence(a, b, 0.5, **kwargs), compare(a, b, sign=1, threshold=0.25, **kwargs)
        assert (eq.low95, eq.high95, eq.df, eq.n_a, eq.n_b) == pytest.approx((cmp.low, cmp.high, cmp.df, cmp.n_a,
                                                                             cmp.n_b))
    paired = equivalence(a[:24], b, 0.5, paired=True)
    assert (paired.low95, paired.high95) == pytest.approx(
        (compare(a[:24], b, sign=1, threshold=0.25, paired=True).low,
         compare(a[:24], b, sign=1, threshold=0.25, paired=True).high))


@pytest.mark.parametrize(("kwargs", "message"), [({"margin": 0}, "margin=0"), ({"margin": 0.1, "level": 0.4},
                                                                                "level=0.4")])
def test_bad_equivalence_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        equivalence([1, 2], [3, 4], **kwargs)
