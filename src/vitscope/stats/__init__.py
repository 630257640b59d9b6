"""The one decision rule for every claim a study checks: an interval, a verdict and a power line (pure functions).

The unit of a claim about training (a protocol, a normaliser, registers) is the seed: ``a`` and ``b`` hold one
value per seed and every value is used, whatever the counts. ``compare`` gives the difference ``mean(a) - mean(b)``
and its 95 % interval (``estimate``):

* seeds, unpaired: Welch's t-interval (Welch-Satterthwaite degrees of freedom), whose coverage holds at 2-10 seeds
  per side where a percentile bootstrap's does not (0.94-0.98 in simulation at spread ratios 1-30; its one limit,
  stated with every such comparison in ``Comparison.limits`` and ``reason``: at 2 seeds on a side it covers about
  0.94 when one side's spread is ten or more times the other's);
* one side known exactly by construction (``b`` one number, e.g. softmax's fraction of exact zeros, 0): the
  one-sample t-interval of the other side against it (df n - 1); values that merely happen to be equal are a
  sample, passed as a sequence;
* seeds, paired (``paired=True``, the same seeds or images on both sides): the t-interval of the differences;
* per-unit values with ``clusters`` (tokens and the image each came from): a cluster-robust t interval over
  images, never tokens, since tokens of one image are not independent (``cluster_robust_se``: the bias-reduced
  CR2 variance with Satterthwaite degrees of freedom from each side's own spread, as Welch's). Its coverage holds
  from 2 images per side (0.94-0.97 in simulation at spread ratios 1-30, unequal image sizes) with Welch's one
  limit at 2 images on a side, stated in the same way. An image-resampling percentile bootstrap's did not hold
  (0.75 at 3 images per side, 0.92 at 30), nor did one common variance in the df (0.90 at 3 v 3 images with
  image-level spreads 2 and 0.5).

The rule, with ``sign`` the paper's direction (+1 or -1) and ``threshold`` half the paper's effect (a magnitude):

* **reproduced**: the interval excludes zero in the paper's direction and the estimate reaches the threshold;
* **not reproduced**: the whole interval lies below the threshold in the paper's direction;
* **inconclusive** otherwise, and always below 2 seeds (or 2 images) per side, or when there is no spread to
  build an interval from; ``reason`` says why;
* **not testable**: the claim's precondition fails at the run's scale (``verdict(result, Precondition(False,
  reason))``: e.g. no condition attends measurably below uniform, so no locality effect can show), whatever the
  interval says; ``reason`` is the precondition's. Every study's verdict goes through ``verdict``.

A claim of direction only (``threshold=None``): reproduced when the interval excludes zero in the paper's
direction, not reproduced when the whole interval lies at or beyond zero on the other side, inconclusive
otherwise. A claim of no difference: ``equivalence`` (two one-sided tests with a stated margin).

Power, for the test actually used (``power``): ``min_detectable`` is the smallest true difference the test detects
with 80 % power at a two-sided 5 % level at the observed spread (Welch's test with its estimated df: at 2 seeds a
side about 10.4 sigma, not the 5.4 sigma a known-df approximation gives), and ``seeds_needed`` the seeds per side
at which it detects the paper's effect (twice the threshold). ``power_sentence`` (and ``Comparison.power_sentence``)
says what N seeds can say, in one sentence for a report.
"""

from vitscope.lazy_import import submodule_getattr
from vitscope.stats.compare import (
    LEVEL,
    NOT_TESTABLE,
    VERDICTS,
    Comparison,
    Precondition,
    compare,
    judge,
    verdict,
)
from vitscope.stats.distributions import t_quantile, t_quantiles, t_sf
from vitscope.stats.equivalence import Equivalence, equivalence
from vitscope.stats.estimate import MIN_PER_SIDE, Estimate, cluster_robust_se, estimate
from vitscope.stats.power import (
    MAX_SEEDS,
    POWER,
    detect_sentence,
    min_detectable,
    pooled_power,
    power_sentence,
    seeds_needed,
    t_power,
    welch_power,
)
from vitscope.stats.proportion import wilson_interval

__all__ = ["LEVEL", "MAX_SEEDS", "MIN_PER_SIDE", "NOT_TESTABLE", "POWER", "VERDICTS", "Comparison", "Equivalence",
           "Estimate", "Precondition", "cluster_robust_se", "compare", "detect_sentence", "equivalence", "estimate",
           "judge", "min_detectable", "pooled_power", "power_sentence", "seeds_needed", "t_power", "t_quantile",
           "t_quantiles", "t_sf", "verdict", "welch_power", "wilson_interval"]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
