"""The one rule's cost per comparison: ``compare`` (interval, verdict and the power of the test used) against the
interval alone (``estimate`` and its t quantile), the reference measured in the same run.

Usage: python benchmarks/bench_stats.py [--comparisons 200] [--repeats 5]

Each case draws ``--comparisons`` fresh random comparisons (so no power is served from the caches of an earlier
identical call; the quadrature grids of each count are cached, as in a study) and times them; the medians of
``--repeats`` passes are printed in milliseconds per comparison, with the ratio to the interval alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from vitscope.stats import compare, estimate, t_quantile


def _cases(rng: np.random.Generator):
    ids = np.repeat(np.arange(20), 8)
    return {
        "2 v 2 seeds, Welch": lambda: (rng.normal(0, 1, 2), rng.normal(0, 1, 2), {}),
        "5 v 5 seeds, Welch": lambda: (rng.normal(0, 1, 5), rng.normal(0, 2, 5), {}),
        "8 v 8 seeds, Welch": lambda: (rng.normal(0, 1, 8), rng.normal(0, 1, 8), {}),
        "4 seeds against a known value": lambda: (rng.normal(0.3, 0.1, 4), 0.0, {}),
        "20 v 20 images, clustered": lambda: (rng.normal(0, 1, 160), rng.normal(0, 1, 160),
                                              {"clusters": (ids, ids + 20)}),
    }


def _time(function, inputs) -> float:
    start = time.perf_counter()
    for a, b, kwargs in inputs:
        function(a, b, kwargs)
    return (time.perf_counter() - start) / len(inputs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    def full(a, b, kwargs):
        return compare(a, b, sign=1, threshold=0.5, **kwargs)

    def interval(a, b, kwargs):
        est = estimate(a, b, **kwargs)
        return est.difference - t_quantile(0.975, est.df) * est.se

    print(f"{'case':34s} {'compare ms':>11s} {'interval ms':>12s} {'ratio':>6s}")
    for name, draw in _cases(rng).items():
        times_full, times_interval = [], []
        for _ in range(args.repeats):
            inputs = [draw() for _ in range(args.comparisons)]
            times_interval.append(_time(interval, inputs))
            times_full.append(_time(full, inputs))
        f, i = statistics.median(times_full), statistics.median(times_interval)
        print(f"{name:34s} {f:11.2f} {i:12.3f} {f / i:6.0f}")


if __name__ == "__main__":
    main()
