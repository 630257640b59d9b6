"""The interval of one binomial proportion (a probe's top-1 over its test images; pure)."""

from __future__ import annotations

import math

from vitscope.stats.distributions import normal_quantile


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / n`` (e.g. a probe's top-1 over ``n`` test
    images): (low, high) in [0, 1]. It stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal
    (Wald) interval does not."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    if not 0 < level < 1:
        raise ValueError(f"wilson_interval: level={level} must lie in (0, 1), e.g. 0.95")
    z = normal_quantile((1 + level) / 2)
    p, z2 = successes / n, z * z / n
    centre = (p + z2 / 2) / (1 + z2)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n)) / (1 + z2)
    return max(0.0, centre - half), min(1.0, centre + half)
