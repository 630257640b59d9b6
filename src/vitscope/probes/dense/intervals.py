"""95 % intervals for dense-probe scores and their differences, over evaluation images and head seeds.

A segmentation score is dataset-level: mIoU is a ratio of pixel counts summed over every evaluation image (one
confusion matrix), not a mean of per-image scores, so the image-level t-interval of ``vitscope.stats`` does not
apply to it directly. Its sampling error over images is estimated by the **delete-one-group jackknife** (Quenouille,
Tukey; Efron and Stein 1981): the score (or the with-minus-without difference of two heads scored on the same
images) is recomputed with each group of images left out of the summed confusion matrices, and
var = (G - 1) / G x sum_g (D_(g) - mean D_(.))². A group is one image by default (clustered by image, as
``vitscope.stats`` clusters tokens); frames of one video can be grouped in runs of consecutive frames (``blocks``),
which keeps their serial correlation inside a group. The jackknife suits a smooth function of sums such as a
ratio of pixel counts (it is the delta method's variance without its derivatives), it is paired by construction
(both heads lose the same images), and for a mean of per-image values (depth RMSE per image) it equals the paired
t-interval exactly. Its coverage on a ratio of sums is checked by simulation in ``tests/test_dense_intervals.py``.

**Head seeds.** Each of S head seeds (initialisation, batch order and loss points) gives its own difference D_s on
the same images. The estimate is their mean D = mean_s D_s; the jackknife runs on D itself (every seed's heads lose
the same group), which gives the image part of its variance, V_img; the seed part is V_seed = var_s(D_s) / S (the
spread of the seeds' differences, which the images do not vary between). The two are added (the seed spread is
training noise independent of which images were drawn) and the interval is D +- t x sqrt(V_img + V_seed), with
Welch-Satterthwaite degrees of freedom from (G - 1) and (S - 1). With one seed the seed part is unknown and left
out, which the method line says. Neither part covers the choice of training images: every head sees the same
training split.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from vitscope.stats import t_quantile

LEVEL = 0.95


@dataclass(frozen=True)
class DenseInterval:
    """``difference`` (a - b, or a alone when b is None) with its 95 % interval [``low``, ``high``]: ``se`` =
    sqrt(``image_se``² + ``seed_se``²) on ``df`` degrees of freedom; ``per_seed`` each seed's difference on every
    image; ``images`` evaluation images in ``groups`` jackknife groups; ``method`` in words."""

    difference: float
    low: float
    high: float
    se: float
    df: float
    image_se: float
    seed_se: float
    per_seed: list[float]
    seeds: int
    images: int
    groups: int
    method: str

    def as_dict(self) -> dict:
        return asdict(self)


def miou_of(confusion: Tensor) -> Tensor:
    """mIoU in percent of (..., C, C) confusion counts (rows = label): IoU per class over the classes present in
    label or prediction, as ``vitscope.metrics.dense.segmentation_scores``; NaN with no class present."""
    confusion = confusion.double()
    tp = confusion.diagonal(dim1=-2, dim2=-1)
    union = confusion.sum(-2) + confusion.sum(-1) - tp
    present = union > 0
    iou = torch.where(present, tp / torch.where(present, union, torch.ones_like(union)), torch.zeros_like(tp))
    return 100.0 * iou.sum(-1) / present.sum(-1)


def pixel_accuracy_of(confusion: Tensor) -> Tensor:
    """Pixel accuracy in percent of (..., C, C) confusion counts."""
    confusion = confusion.double()
    return 100.0 * confusion.diagonal(dim1=-2, dim2=-1).sum(-1) / confusion.sum((-2, -1))


def group_index(images: int, blocks: int | None) -> Tensor:
    """(images,) jackknife group of each image: every image alone (``blocks`` None), or runs of consecutive images
    in ``blocks`` groups of near-equal size (frames of a video kept together)."""
    if blocks is None or blocks >= images:
        return torch.arange(images)
    if blocks < 2:
        raise ValueError(f"a jackknife needs at least 2 groups, got blocks={blocks}")
    return torch.div(torch.arange(images) * blocks, images, rounding_mode="floor")


def miou_difference(conf_a: Tensor, conf_b: Tensor | None = None, *, blocks: int | None = None,
                    metric: str = "miou") -> DenseInterval:
    """mIoU (or ``metric="pixel_accuracy"``) of heads a minus heads b with its interval (module docstring):
    ``conf_a``, ``conf_b`` (seeds, images, C, C) per-image confusion counts of the same images, seed s of a paired
    with seed s of b; ``conf_b`` None: a's score alone."""
    score = {"miou": miou_of, "pixel_accuracy": pixel_accuracy_of}[metric]
    conf_a = _four(conf_a)
    if conf_b is not None:
        conf_b = _four(conf_b)
        if conf_b.shape != conf_a.shape:
            raise ValueError(f"paired confusions need one shape (seeds, images, C, C): {tuple(conf_a.shape)} and "
                             f"{tuple(conf_b.shape)}")
    groups = group_index(conf_a.shape[1], blocks)
    count = int(groups.max()) + 1

    def statistic(conf: Tensor) -> tuple[Tensor, Tensor]:
        total = conf.sum(1)  # (S, C, C)
        sums = torch.zeros(count, *total.shape, dtype=conf.dtype).index_add_(0, groups, conf.transpose(0, 1))
        return score(total), score(total[None] - sums)  # (S,), (G, S)

    full_a, left_a = statistic(conf_a)
    if conf_b is None:
        return combine(full_a, left_a, images=conf_a.shape[1], what=metric)
    full_b, left_b = statistic(conf_b)
    return combine(full_a - full_b, left_a - left_b, images=conf_a.shape[1], what=f"{metric} difference")


def mean_difference(values_a: Tensor, values_b: Tensor | None = None, *, blocks: int | None = None,
                    what: str = "mean difference") -> DenseInterval:
    """The same for a score that is a mean over images (depth RMSE per image): ``values_a``, ``values_b``
    (seeds, images); the jackknife of a mean is the paired t-interval over images."""
    values = values_a.double() if values_b is None else values_a.double() - values_b.double()
    values = values[None] if values.dim() == 1 else values
    groups = group_index(values.shape[1], blocks)
    count = int(groups.max()) + 1
    sums = torch.zeros(count, values.shape[0], dtype=values.dtype).index_add_(0, groups, values.T)
    sizes = torch.bincount(groups, minlength=count).double()[:, None]
    full = values.mean(1)
    left = (values.sum(1)[None] - sums) / (values.shape[1] - sizes)
    return combine(full, left, images=values.shape[1], what=what)


def combine(full: Tensor, left_out: Tensor, *, images: int, what: str = "difference") -> DenseInterval:
    """The interval from each seed's statistic on every image, ``full`` (S,), and with each jackknife group left
    out, ``left_out`` (G, S) (module docstring)."""
    seeds, count = full.shape[0], left_out.shape[0]
    estimate = float(full.mean())
    leave = left_out.mean(1)  # (G,): the seed-mean statistic without group g
    image_var = float((count - 1) / count * ((leave - leave.mean()) ** 2).sum()) if count > 1 else math.nan
    seed_var = float(full.var(unbiased=True)) / seeds if seeds > 1 else 0.0
    total = image_var + seed_var
    if seeds > 1 and total > 0:
        df = total ** 2 / (image_var ** 2 / (count - 1) + seed_var ** 2 / (seeds - 1))
    else:
        df = float(count - 1)
    se = math.sqrt(total) if total >= 0 else math.nan
    if math.isnan(se) or se == 0 or count < 2:
        low = high = math.nan
    else:
        half = t_quantile(0.5 + LEVEL / 2, df) * se
        low, high = estimate - half, estimate + half
    grouping = "one image a group" if count == images else f"{count} groups of consecutive images"
    seeds_words = (f"plus the spread of {seeds} head seeds (var / {seeds}), Satterthwaite df {df:.1f}" if seeds > 1
                   else "one head seed: seed-to-seed spread not included")
    method = f"{what}: delete-a-group jackknife over {images} evaluation images ({grouping}), {seeds_words}"
    return DenseInterval(estimate, low, high, se, df, math.sqrt(max(image_var, 0.0)), math.sqrt(seed_var),
                         [float(x) for x in full], seeds, images, count, method)


def _four(conf: Tensor) -> Tensor:
    if conf.dim() == 3:
        return conf[None]
    if conf.dim() != 4 or conf.shape[-1] != conf.shape[-2]:
        raise ValueError(f"confusions must be (seeds, images, C, C) or (images, C, C); got {tuple(conf.shape)}")
    return conf
