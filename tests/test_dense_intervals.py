"""Intervals for dense-probe scores (``vitscope.probes.dense.intervals``): the jackknife over evaluation images for
a dataset-level mIoU difference, checked against scipy where it reduces to a t-interval and by simulation where it
does not (coverage of a ratio of pixel counts), with and without head-seed noise."""

import numpy as np
import pytest
import torch
from scipy import stats

from vitscope.metrics.dense import segmentation_scores
from vitscope.probes.dense.intervals import group_index, mean_difference, miou_difference, miou_of

CLASSES = 4
ALPHA = np.array([4.0, 2.0, 1.0, 0.5])  # class composition of an image ~ Dirichlet(ALPHA)
SKILL = 0.8  # per-image difficulty shared by both predictors (what makes the pair correlated)
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(60)
WEIGHTS = WEIGHTS / WEIGHTS.sum()


def _probabilities(logit_correct: np.ndarray) -> np.ndarray:
    """(..., C) logits of a correct prediction per class -> (..., C, C) rows = label, columns = prediction: the
    label with sigmoid(logit), every other class alike with the rest."""
    p = 1 / (1 + np.exp(-logit_correct))
    probs = np.repeat(((1 - p) / (CLASSES - 1))[..., None], CLASSES, axis=-1)
    idx = np.arange(CLASSES)
    probs[..., idx, idx] = p
    return probs


def _draw(rng: np.random.Generator, images: int, betas: list[np.ndarray], seed_noise: list[np.ndarray]
          ) -> list[np.ndarray]:
    """Per-image confusion counts (seeds, images, C, C) of each predictor on one sample of images: sizes 400-1600
    pixels, Dirichlet compositions, a shared difficulty u; predictor k's seed s has logits beta_k + noise[k][s] +
    SKILL u."""
    sizes = rng.integers(400, 1600, images)
    counts = rng.multinomial(sizes, rng.dirichlet(ALPHA, images))  # (images, C)
    u = rng.normal(size=images)
    out = []
    for beta, noise in zip(betas, seed_noise, strict=True):
        logits = beta[None, None] + noise[:, None, None] + SKILL * u[None, :, None]  # (seeds, images, C)
        out.append(rng.multinomial(np.broadcast_to(counts, logits.shape), _probabilities(logits)))
    return out


def _population_miou(beta: np.ndarray, noise_sd: float) -> float:
    """The population value the probe estimates: mIoU of the expected total confusion matrix, averaged over the
    seed noise (by Gauss-Hermite quadrature over the difficulty u and the seed noise e)."""
    total = 0.0
    for e, we in zip(NODES * noise_sd if noise_sd else [0.0], WEIGHTS if noise_sd else [1.0], strict=True):
        probs = sum(w * _probabilities(beta + e + SKILL * u) for u, w in zip(NODES, WEIGHTS, strict=True))
        expected = (ALPHA / ALPHA.sum())[:, None] * probs  # E[size] cancels in the ratio
        total += we * float(miou_of(torch.tensor(expected)))
    return total


def test_miou_of_is_segmentation_scores_miou_with_absent_classes():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        confusion = torch.randint(0, 50, (5, 5), generator=generator)
        confusion[2] = 0
        confusion[:, 2] = 0  # class 2 absent from labels and predictions: left out of the mean
        assert float(miou_of(confusion)) == pytest.approx(segmentation_scores(confusion)["miou"], rel=1e-12)


def test_mean_difference_is_the_paired_t_interval_over_images_with_one_seed():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1.0, 1.0, 25), rng.normal(0.7, 1.0, 25)
    found = mean_difference(torch.tensor(a)[None], torch.tensor(b)[None])
    reference = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert found.difference == pytest.approx(float(np.mean(a - b)), rel=1e-12)
    assert (found.low, found.high) == pytest.approx((reference.low, reference.high), rel=1e-4)
    assert found.df == 24 and "one head seed" in found.method


def test_with_no_image_spread_the_seed_part_is_the_one_sample_t_over_seeds():
    per_seed = np.array([0.3, -0.1, 0.5, 0.2])
    values = torch.tensor(per_seed)[:, None].expand(4, 30).clone()  # every image gives its seed's value
    found = mean_difference(values)
    reference = stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.95)
    assert found.image_se == pytest.approx(0.0, abs=1e-12) and found.df == pytest.approx(3.0)
    assert (found.low, found.high) == pytest.approx((reference.low, reference.high), rel=1e-4)


def test_blocks_group_consecutive_images():
    assert group_index(10, None).tolist() == list(range(10))
    assert group_index(10, 3).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="at least 2 groups"):
        group_index(10, 1)


@pytest.mark.parametrize("images,seeds,noise_sd", [(40, 1, 0.0), (60, 3, 0.15)])
def test_jackknife_interval_of_an_miou_difference_covers_the_population_value(images, seeds, noise_sd):
    """Seeded simulation: two predictors on the same images, per-image confusion counts; the 95 % interval of the
    difference of dataset-level mIoU covers the population difference in 0.925-0.975 of 800 samples (the
    binomial sd of a coverage estimate there is 0.008), with one head seed, and with three whose accuracy varies
    from seed to seed (the seed part of the interval then matters: without it coverage falls, checked below)."""
    rng = np.random.default_rng(2024 + images)
    beta_a, beta_b = np.array([1.5, 1.0, 0.3, -0.2]), np.array([1.2, 1.1, 0.1, -0.4])
    truth = _population_miou(beta_a, noise_sd) - _population_miou(beta_b, noise_sd)
    trials, covered, image_only = 800, 0, 0
    for _ in range(trials):
        noise = [rng.normal(0, noise_sd, seeds) for _ in range(2)]
        conf_a, conf_b = _draw(rng, images, [beta_a, beta_b], noise)
        found = miou_difference(torch.tensor(conf_a), torch.tensor(conf_b))
        covered += found.low <= truth <= found.high
        half = stats.t.ppf(0.975, images - 1) * found.image_se
        image_only += found.difference - half <= truth <= found.difference + half
    coverage = covered / trials
    print(f"coverage {coverage:.3f}, image part only {image_only / trials:.3f}")
    assert 0.925 <= coverage <= 0.975, coverage
    if noise_sd:
        assert image_only / trials < coverage - 0.03, (image_only / trials, coverage)
