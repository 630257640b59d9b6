"""Power for the test actually used (vitscope.stats.power): Welch's test with its estimated df, the one-sample and
paired t, against simulations of the tests themselves and scipy's noncentral t; and compare's power line from it.
The known-df approximation it replaces, (t_0.975 + t_0.8) x SE, said 5.4 sigma at 2 seeds a side, where Welch's
test has power 0.45; it needs 10.4 sigma."""

import math

import numpy as np
import pytest

import vitscope.stats.power as power_module
from vitscope.stats import (
    compare,
    min_detectable,
    pooled_power,
    power_sentence,
    seeds_needed,
    t_power,
    t_quantile,
    t_quantiles,
    welch_power,
)
from vitscope.stats.distributions import _t_quantile


def _simulated_welch_power(effect, sd_a, sd_b, n_a, n_b, draws=40000, seed=0):
    """Welch's two-sided 5 % test run on normal samples, by hand (exact df, as scipy's ttest_ind does)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(effect, sd_a, (draws, n_a))
    b = rng.normal(0.0, sd_b, (draws, n_b))
    va, vb = a.var(axis=1, ddof=1) / n_a, b.var(axis=1, ddof=1) / n_b
    t = (a.mean(1) - b.mean(1)) / np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    return float(np.mean(np.abs(t) > t_quantiles(0.975, df)))


@pytest.mark.parametrize("df", [1.0, 1.37, 2.0, 3.5, 9.99, 47.2, 1e4])
@pytest.mark.parametrize("p", [0.8, 0.95, 0.975])
def test_vectorised_t_quantiles_equal_the_mpmath_ones(p, df):
    assert t_quantiles(p, np.array([df]))[0] == pytest.approx(_t_quantile(p, df), rel=1e-11)


def test_t_quantiles_refuse_df_below_one():
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_quantiles(0.975, np.array([0.5, 2.0]))
    assert t_quantile(0.975, 0.5) > t_quantile(0.975, 1)  # the scalar one still serves df < 1


@pytest.mark.parametrize(("effect", "sd_a", "sd_b", "n_a", "n_b"), [
    (5.36, 1.0, 1.0, 2, 2),   # the known-df approximation's 80 % point: really about 0.45
    (10.39, 1.0, 1.0, 2, 2),  # Welch's own 80 % point
    (3.0, 1.0, 4.0, 3, 3),    # sides four times apart
    (1.0, 0.3, 0.5, 3, 3),
    (1.0, 1.0, 0.25, 5, 5),
    (1.0, 1.0, 1.0, 10, 10),
    (1.5, 2.0, 0.5, 4, 12),   # unequal counts
])
def test_welch_power_equals_a_simulation_of_welchs_test(effect, sd_a, sd_b, n_a, n_b):
    simulated = _simulated_welch_power(effect, sd_a, sd_b, n_a, n_b)
    assert welch_power(effect, sd_a, sd_b, n_a, n_b) == pytest.approx(simulated, abs=0.008)  # 3.5 standard errors


def test_two_seeds_a_side_need_about_ten_sigma_not_five():
    assert welch_power(5.36, 1.0, 1.0, 2, 2) == pytest.approx(0.45, abs=0.01)
    assert min_detectable(1.0, 1.0, 2, 2) == pytest.approx(10.39, abs=0.02)
    old = (t_quantile(0.975, 2) + t_quantile(0.8, 2)) * 1.0  # df 2 treated as known, SE sqrt(1/2 + 1/2)
    assert old == pytest.approx(5.36, abs=0.01)


def test_welch_power_against_scipys_ttest_ind():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for effect, sd_a, sd_b, n_a, n_b in [(10.39, 1, 1, 2, 2), (5.36, 1, 1, 2, 2), (2.0, 0.5, 2.0, 3, 3),
                                         (0.8, 1.0, 0.3, 6, 4)]:
        a, b = rng.normal(effect, sd_a, (40000, n_a)), rng.normal(0, sd_b, (40000, n_b))
        rejected = stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue < 0.05
        assert welch_power(effect, sd_a, sd_b, n_a, n_b) == pytest.approx(rejected.mean(), abs=0.008)


@pytest.mark.parametrize(("effect", "sd", "n"), [(3.0, 1.0, 2), (1.0, 1.0, 5), (0.3, 1.0, 200), (2.0, 0.7, 3)])
def test_one_sample_power_is_the_noncentral_t(effect, sd, n):
    stats = pytest.importorskip("scipy.stats")
    q, ncp = stats.t.ppf(0.975, n - 1), effect / (sd / math.sqrt(n))
    exact = stats.nct.sf(q, n - 1, ncp) + stats.nct.cdf(-q, n - 1, ncp)
    assert t_power(effect, sd, n) == pytest.approx(exact, abs=1e-8)
    assert pooled_power(effect, sd, n, 1) == pytest.approx(
        stats.nct.sf(stats.t.ppf(0.975, n - 1), n - 1, effect / (sd * math.sqrt(1 / n + 1)))
        + stats.nct.cdf(-stats.t.ppf(0.975, n - 1), n - 1, effect / (sd * math.sqrt(1 / n + 1))), abs=1e-8)


def test_one_sample_power_equals_a_simulation():
    rng = np.random.default_rng(2)
    for effect, sd, n in [(3.0, 1.0, 2), (1.0, 1.0, 5)]:
        x = rng.normal(effect, sd, (40000, n))
        t = x.mean(1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
        assert t_power(effect, sd, n) == pytest.approx(np.mean(np.abs(t) > t_quantile(0.975, n - 1)), abs=0.008)


def test_a_side_with_no_spread_is_the_one_sample_test():
    assert welch_power(1.0, 0.8, 0.0, 4, 4) == t_power(1.0, 0.8, 4)
    assert welch_power(1.0, 0.0, 0.8, 9, 4) == t_power(1.0, 0.8, 4)


def test_the_integration_has_converged(monkeypatch):
    cases = [(2.0, 1, 1, 2, 2), (3.0, 1, 4, 3, 3), (0.5, 1, 0.3, 50, 40), (1.0, 1, 3, 2, 30), (0.2, 1, 1, 800, 800)]
    ours = [welch_power(*c) for c in cases]
    monkeypatch.setattr(power_module, "_POINTS", 300)
    for cached in (power_module._radius_grid, power_module._angle_grid, power_module._welch_critical):
        cached.cache_clear()
    try:
        assert ours == pytest.approx([welch_power(*c) for c in cases], abs=1e-8)
    finally:
        for cached in (power_module._radius_grid, power_module._angle_grid, power_module._welch_critical):
            cached.cache_clear()


@pytest.mark.parametrize(("sd_a", "sd_b", "n_a", "n_b"), [(1, 1, 2, 2), (0.3, 1.2, 3, 5), (1, 0, 4, 0)])
def test_min_detectable_is_where_the_power_reaches_80_percent(sd_a, sd_b, n_a, n_b):
    detect = min_detectable(sd_a, sd_b, n_a, n_b)
    assert welch_power(detect, sd_a, sd_b, n_a, n_b) == pytest.approx(0.8, abs=1e-8)
    assert min_detectable(sd_a, sd_b, n_a, n_b, power=0.5) < detect


@pytest.mark.parametrize(("effect", "sd_a", "sd_b"), [(1.0, 1.0, 1.0), (0.2, 0.05, 0.3), (0.1, 0.03, 0.0),
                                                      (5.0, 1.0, 1.0)])
def test_seeds_needed_is_the_first_count_that_reaches_80_percent(effect, sd_a, sd_b):
    n = seeds_needed(effect, sd_a, sd_b)
    assert welch_power(effect, sd_a, sd_b, n, n) >= 0.8
    if n > 2:
        assert welch_power(effect, sd_a, sd_b, n - 1, n - 1) < 0.8
    assert seeds_needed(0.001, 1.0, 1.0) is None  # past 1000 seeds


def test_compare_reports_the_power_of_welchs_test():
    # the long CPU run's epoch-50 minimum early MAD (docs/results/locality-cpu/long/results.json), CutMix v baseline
    cutmix, baseline = [0.35513678193092346, 0.3635791838169098], [0.3412650227546692, 0.35586610436439514]
    result = compare(cutmix, baseline, sign=-1, threshold=0.1)
    sd_a, sd_b = float(np.std(cutmix, ddof=1)), float(np.std(baseline, ddof=1))
    assert result.min_detectable == pytest.approx(min_detectable(sd_a, sd_b, 2, 2))
    assert result.min_detectable == pytest.approx(0.0938, abs=0.0005)  # the page had said 0.056
    assert result.seeds_needed == seeds_needed(0.2, sd_a, sd_b)
    assert "Welch's t-test" in result.power_line()
    simulated = _simulated_welch_power(result.min_detectable, sd_a, sd_b, 2, 2, seed=5)
    assert simulated == pytest.approx(0.8, abs=0.008)


def test_compare_reports_the_power_of_the_paired_and_one_sample_tests():
    a, b = np.array([0.52, 0.55, 0.51, 0.56]), np.array([0.50, 0.51, 0.50, 0.52])
    paired = compare(a, b, sign=1, threshold=0.01, paired=True)
    sd = float(np.std(a - b, ddof=1))
    assert paired.min_detectable == pytest.approx(min_detectable(sd, 0, 4, 0))
    assert paired.seeds_needed == seeds_needed(0.02, sd, 0)
    known = compare(a, 0.5, sign=1, threshold=0.01)
    assert known.min_detectable == pytest.approx(min_detectable(float(np.std(a, ddof=1)), 0, 4, 0))
    assert "one-sample t-test" in known.power_line()


def test_the_sentence_says_what_the_seeds_can_detect():
    sentence = power_sentence(1.0, 1.0, 2, 2)
    assert sentence.startswith("with 2 seeds a side, Welch's test has 80 % power only for differences of 10.4")
    assert "3 vs 5 images" in power_sentence(1.0, 2.0, 3, 5, unit="images")
    assert "against a known value" in power_sentence(1.0, 0.0, 3, 0)
    cutmix, baseline = [0.35513678193092346, 0.3635791838169098], [0.3412650227546692, 0.35586610436439514]
    result = compare(cutmix, baseline, sign=-1, threshold=0.1)
    assert result.power_sentence() == "with 2 seeds a side, Welch's t-test has 80 % power only for differences of " \
                                      "0.0938 or more (two-sided 5 % level, at the observed spread)"
    assert result.as_dict()["power_sentence"] == result.power_sentence()
    paired = compare([0.5, 0.6, 0.55], [0.4, 0.45, 0.5], sign=1, threshold=0.1, paired=True)
    assert paired.power_sentence().startswith("with 3 paired seeds, the paired t-test has 80 % power")
    known = compare([0.3, 0.35, 0.31], 0.0, sign=1, threshold=0.1)
    assert known.power_sentence().startswith("with 3 seeds against the known value 0, the one-sample t-test")
    assert compare([0.3], [0.2], sign=1, threshold=0.1).power_sentence().startswith("needs >= 2")


@pytest.mark.parametrize(("args", "message"), [((1.0, 0.0, 0.0, 2, 2), "not both 0"),
                                               ((1.0, 1.0, 1.0, 1, 2), "n_a=1"),
                                               ((1.0, -1.0, 1.0, 2, 2), "sd_a=-1")])
def test_bad_power_arguments_name_the_value(args, message):
    with pytest.raises(ValueError, match=message):
        welch_power(*args)
