"""Summary statistics for benchmark samples: median, p10/p90, spread warning, bootstrap speed-up CI.

pyperf's rules: warmups never reach these functions; the spread is flagged when the standard deviation
is at least 10 % of the mean; comparisons come with an interval, not a bare ratio.

Example::

    summary = summarize([37.1, 37.4, 36.9])
    speedup = bootstrap_speedup(baseline=[68.9, 69.2, 68.7], variant=[37.1, 37.4, 36.9])
    print(summary.median, speedup.ratio, speedup.low, speedup.high)
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SPREAD_WARNING_RATIO = 0.10
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """Location and spread of one sample (seconds, bytes, Wh: whatever was measured)."""

    n: int
    median: float
    p10: float
    p90: float
    mean: float
    stdev: float
    minimum: float
    maximum: float

    @property
    def spread_ratio(self) -> float:
        """Standard deviation over mean (0 for one value or a zero mean)."""
        return self.stdev / self.mean if self.mean else 0.0

    @property
    def spread_warning(self) -> bool:
        """True when stdev ≥ 10 % of the mean: the figures are not to be trusted as they are."""
        return self.n >= 2 and self.spread_ratio >= SPREAD_WARNING_RATIO


@dataclass(frozen=True)
class Speedup:
    """Ratio of medians ``baseline / variant`` with a bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    confidence: float = CONFIDENCE

    @property
    def significant(self) -> bool:
        """True when the interval excludes 1.0 (the variant is surely faster, or surely slower)."""
        return not self.low <= 1.0 <= self.high


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation, as ``numpy.percentile`` computes it."""
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def summarize(values: Sequence[float]) -> Summary:
    """Median, p10, p90, mean, sample stdev, min, max of ``values`` (at least one value)."""
    if not values:
        raise ValueError("cannot summarize an empty sample")
    data = [float(v) for v in values]
    return Summary(
        n=len(data),
        median=statistics.median(data),
        p10=percentile(data, 10),
        p90=percentile(data, 90),
        mean=statistics.fmean(data),
        stdev=statistics.stdev(data) if len(data) >= 2 else 0.0,
        minimum=min(data),
        maximum=max(data),
    )


def bootstrap_speedup(
    baseline: Sequence[float],
    variant: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Speedup:
    """``median(baseline) / median(variant)`` with a percentile-bootstrap interval.

    Both samples are resampled independently with replacement; ``seed`` makes the interval repeatable.
    With one value per side the interval collapses onto the ratio (there is nothing to resample).
    """
    if not baseline or not variant:
        raise ValueError("bootstrap_speedup needs at least one value on each side")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    if min(variant) <= 0:
        raise ValueError(f"variant times must be positive, got {min(variant)}")
    ratio = statistics.median(baseline) / statistics.median(variant)
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(baseline, k=len(baseline)))
        / statistics.median(rng.choices(variant, k=len(variant)))
        for _ in range(resamples)
    )
    tail = (1 - confidence) / 2 * 100
    return Speedup(ratio, percentile(ratios, tail), percentile(ratios, 100 - tail), confidence)


def drift_verdict(values: Sequence[float], *, tolerance: float = 0.05) -> tuple[str, float]:
    """``("stable" | "drifting", relative change)`` of a per-round series (soak mode).

    The relative change is the least-squares slope times the number of rounds, over the first-half
    median: how much the series moved across the soak. More than ``tolerance`` (5 %) is a drift.
    """
    if len(values) < 2:
        raise ValueError("a drift verdict needs at least two rounds")
    n = len(values)
    xs = range(n)
    x_mean = (n - 1) / 2
    y_mean = statistics.fmean(values)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, values, strict=True)) / sum(
        (x - x_mean) ** 2 for x in xs
    )
    reference = statistics.median(values[: max(1, n // 2)]) or 1.0
    change = slope * (n - 1) / reference
    return ("drifting" if abs(change) > tolerance else "stable"), change
