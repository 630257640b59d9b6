"""Linear read-outs against known answers: a planted linear rule, the Bayes direction, exact least squares."""

import pytest
import torch

from vitscope.probes.linear import fit_classifier, fit_regressor, stratified_split


def test_planted_linear_rule_is_learned_exactly():
    torch.manual_seed(0)
    rule = torch.randn(4, 12)
    x = torch.randn(600, 12) * 3 + 1.5  # off-centre and scaled: the standardiser must cope
    y = (x @ rule.T).argmax(1)
    clf = fit_classifier(x[:400], y[:400], 4, epochs=200)
    assert clf.top1(x[:400], y[:400]) >= 0.97
    assert clf.top1(x[400:], y[400:]) >= 0.93
    assert len(clf.settings["sweep"]) == 9 and clf.settings["lr"] in (1e-3, 1e-2, 1e-1)


def test_two_gaussians_recover_the_bayes_direction():
    """Equal-covariance classes: the optimal boundary is normal to the mean difference."""
    torch.manual_seed(1)
    direction = torch.nn.functional.normalize(torch.randn(8), dim=0)
    y = torch.arange(2).repeat(1000)
    x = torch.randn(2000, 8) + (2 * y[:, None] - 1) * direction
    clf = fit_classifier(x, y, 2, lrs=(0.05,), weight_decays=(0.0,), epochs=100)
    learned = (clf.weight[1] - clf.weight[0]) / clf.std  # back to raw feature units
    assert torch.nn.functional.cosine_similarity(learned, direction, dim=0) > 0.98
    assert clf.settings["sweep"] == []


def test_sweep_picks_the_setting_that_learns():
    torch.manual_seed(2)
    x = torch.randn(300, 6)
    y = (x[:, 0] > 0).long()
    clf = fit_classifier(x, y, 2, lrs=(1e-7, 0.1), weight_decays=(0.0,), epochs=30)
    assert clf.settings["lr"] == 0.1
    scores = {row["lr"]: row["val_top1"] for row in clf.settings["sweep"]}
    assert scores[0.1] > scores[1e-7]


def test_stratified_split_holds_out_each_class_reproducibly():
    labels = torch.tensor([0] * 50 + [1] * 20 + [2] * 1)
    fit, held = stratified_split(labels, 0.2, seed=3)
    assert labels[held].bincount(minlength=3).tolist() == [10, 4, 0]
    assert sorted(torch.cat([fit, held]).tolist()) == list(range(71))
    again = stratified_split(labels, 0.2, seed=3)
    assert torch.equal(again[1], held) and not torch.equal(stratified_split(labels, 0.2, seed=4)[1], held)


def test_regressor_recovers_an_exact_linear_map():
    torch.manual_seed(4)
    x = torch.randn(500, 10).half()  # a float16 cache, as the feature store keeps
    a, b = torch.randn(10, 3), torch.randn(3)
    t = x.float() @ a + b
    reg = fit_regressor(x, t)
    assert reg.mse(x, t) < 1e-8
    assert reg.settings["weight_decay"] == 1e-6
    raw_weight = reg.weight / reg.std[:, None]
    torch.testing.assert_close(raw_weight.float(), a, atol=1e-4, rtol=1e-4)


def test_regressor_matches_lstsq_on_noisy_data():
    torch.manual_seed(5)
    x, t = torch.randn(200, 5).double(), torch.randn(200, 2).double()
    reg = fit_regressor(x, t, weight_decays=(0.0,))
    design = torch.cat([x, torch.ones(200, 1, dtype=torch.float64)], 1)
    reference = design @ torch.linalg.lstsq(design, t).solution
    torch.testing.assert_close(reg.predict(x).double(), reference, atol=1e-5, rtol=1e-5)


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="outside 0..1"):
        fit_classifier(torch.randn(10, 3), torch.arange(10) % 3, 2)
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        fit_classifier(torch.randn(10, 3, 2), torch.zeros(10), 2)
    with pytest.raises(ValueError, match="9 target rows"):
        fit_regressor(torch.randn(10, 3), torch.randn(9, 2))


def test_mlp_read_out_fits_what_a_linear_map_cannot():
    from vitscope.probes.mlp import fit_mlp_regressor

    torch.manual_seed(6)
    x = torch.randn(800, 4)
    t = x[:, :1] ** 2  # variance 2, no linear component
    assert fit_regressor(x, t).mse(x, t) > 1.5
    assert fit_mlp_regressor(x, t, hidden=64, epochs=300).mse(x, t) < 0.1


def test_chance_level_on_an_empty_split_is_a_clear_error():
    import torch

    from vitscope.probes.baselines import majority_top1

    assert majority_top1(torch.tensor([1, 1, 0]), torch.tensor([1, 0])) == 0.5
    with pytest.raises(ValueError, match="more images"):
        majority_top1(torch.tensor([], dtype=torch.long), torch.tensor([1, 0]))
