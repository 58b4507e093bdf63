"""Summary statistics for benchmark samples: median, p10/p90, spread warning, bootstrap speed-up CI,
and a Mann-Whitney U test of "the variant differs from the baseline".

pyperf's rules: warmups never reach these functions; the spread is flagged when the standard deviation
is at least 10 % of the mean; comparisons come with an interval and a significance test, not a bare
ratio.

Example::

    summary = summarize([37.1, 37.4, 36.9])
    speedup = bootstrap_speedup(baseline=[68.9, 69.2, 68.7], variant=[37.1, 37.4, 36.9])
    test = mann_whitney_u([68.9, 69.2, 68.7], [37.1, 37.4, 36.9])
    print(summary.median, speedup.ratio, speedup.low, speedup.high, test.p_value)   # … 0.1
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SPREAD_WARNING_RATIO = 0.10
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
SIGNIFICANCE_LEVEL = 0.05
# Up to this many values in all, the exact permutation distribution of U is computed (a small
# dynamic programme over the ranks, ties included); beyond it the normal approximation is good.
EXACT_MAX_VALUES = 40


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


@dataclass(frozen=True)
class RankTest:
    """A two-sided Mann-Whitney U test of "the two samples come from the same distribution".

    ``u`` is the statistic of the first sample (the baseline); ``p_floor`` is the smallest two-sided
    p-value any data of these sizes could give (exact permutation test): with 3 values per side it
    is 0.1, so no difference can be significant at 5 %, however large.
    """

    u: float
    p_value: float
    method: str  # "exact" (permutation distribution, ties included) or "asymptotic" (normal, ties)
    n_baseline: int
    n_variant: int
    p_floor: float
    level: float = SIGNIFICANCE_LEVEL

    @property
    def significant(self) -> bool:
        """True when ``p_value < level``: the variant's times differ from the baseline's."""
        return self.p_value < self.level

    @property
    def can_be_significant(self) -> bool:
        """False when the sample sizes alone keep every p-value at or above ``level``."""
        return self.p_floor < self.level


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation (``numpy.percentile``'s default)."""
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    return float(np.percentile(values, q, method="linear"))


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


def drift_verdict(
    values: Sequence[float], *, tolerance: float = 0.05, grows_only: bool = False
) -> tuple[str, float]:
    """``("stable" | "drifting", relative change)`` of a per-round series (soak mode).

    Two views, the larger change wins, over the median of the first half's rounds after the first
    (the first round often settles what later rounds keep, so it is no reference); with ``grows_only``
    over their highest instead (memory that moves between two levels, as the allocator keeps or gives
    back, has not grown until it passes the highest level it already reached):

    - a climb: the Theil–Sen slope (the median of the slopes between every two rounds) times the
      ``n − 1`` steps of the soak; it follows a steady leak, and ignores one odd round;
    - a level shift: the median of the last third against that reference; it sees memory that jumped
      and stayed up for the last rounds, which the median slope can miss.

    More than ``tolerance`` (5 %) is a drift; with ``grows_only`` (memory: a soak looks for leaks) only
    a rise is, and memory the process gave back is no drift. Memory that settles after round 0, or one
    late outlier, is not.
    """
    if len(values) < 2:
        raise ValueError("a drift verdict needs at least two rounds")
    n = len(values)
    slope = statistics.median((values[j] - values[i]) / (j - i) for i in range(n) for j in range(i + 1, n))
    settled = values[1:] if n > 2 else values
    first = settled[: max(1, len(settled) // 2)]
    reference = (max(first) if grows_only else statistics.median(first)) or 1.0
    climb = slope * (n - 1) / reference
    shift = (statistics.median(values[-max(1, n // 3) :]) - reference) / reference
    change = max(climb, shift, key=abs)
    drift = change if grows_only else abs(change)
    return ("drifting" if drift > tolerance else "stable"), change


def smallest_p_value(n_baseline: int, n_variant: int) -> float:
    """The smallest two-sided p-value of an exact Mann-Whitney test with these sample sizes.

    It is reached when the samples do not overlap at all: 2 of the C(n1+n2, n1) equally likely
    rankings are that extreme (``smallest_p_value(3, 3) == 0.1``).
    """
    if n_baseline < 1 or n_variant < 1:
        raise ValueError(f"sample sizes must be ≥ 1, got {n_baseline} and {n_variant}")
    return min(1.0, 2 / math.comb(n_baseline + n_variant, n_baseline))


def repeats_for_significance(level: float = SIGNIFICANCE_LEVEL) -> int:
    """The fewest repeats per variant (equal sizes) for which an exact test can reach ``p < level``."""
    if not 0 < level < 1:
        raise ValueError(f"significance level must be within (0, 1), got {level}")
    n = 1
    while smallest_p_value(n, n) >= level:
        n += 1
    return n


def mann_whitney_u(
    baseline: Sequence[float], variant: Sequence[float], *, level: float = SIGNIFICANCE_LEVEL
) -> RankTest:
    """Two-sided Mann-Whitney U test of ``baseline`` against ``variant`` (distribution-free).

    Up to :data:`EXACT_MAX_VALUES` values in all the p-value is exact: the permutation distribution
    of the rank sum over every way of splitting the pooled (mid-)ranks, ties included, with
    ``p = min(1, 2·min(P(U ≤ u), P(U ≥ u)))`` as :func:`scipy.stats.permutation_test` defines it
    (equal to ``scipy.stats.mannwhitneyu(method="exact")`` without ties). Beyond that, the normal
    approximation with tie correction and continuity correction, as ``method="asymptotic"``.
    """
    if not baseline or not variant:
        raise ValueError("mann_whitney_u needs at least one value on each side")
    n1, n2 = len(baseline), len(variant)
    pooled = np.asarray([*baseline, *variant], dtype=np.float64)
    if not np.all(np.isfinite(pooled)):
        raise ValueError(f"mann_whitney_u needs finite values, got {pooled.tolist()}")
    ranks, tie_sizes = _midranks(pooled)
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    if n1 + n2 <= EXACT_MAX_VALUES:
        p_value, method = _exact_p(ranks, n1), "exact"
    else:
        p_value, method = _asymptotic_p(u, n1, n2, tie_sizes), "asymptotic"
    return RankTest(u, p_value, method, n1, n2, smallest_p_value(n1, n2), level)


def _midranks(values: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], list[int]]:
    """1-based ranks with ties given their mean rank, and the size of every group of ties."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sizes: list[int] = []
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and values[order[end + 1]] == values[order[start]]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        sizes.append(end - start + 1)
        start = end + 1
    return ranks, sizes


def _exact_p(ranks: np.ndarray[Any, Any], n1: int) -> float:
    """Two-sided permutation p-value of the first ``n1`` ranks' sum, by counting subsets."""
    doubled = [round(2 * r) for r in ranks]  # mid-ranks are multiples of 1/2: count in integers
    top = sum(sorted(doubled)[-n1:])
    # ways[k, s]: how many k-subsets of the ranks seen so far have doubled sum s (floats: C(40, 20)
    # is beyond 2**53, and a relative error of 1e-16 is nothing to a p-value).
    ways = np.zeros((n1 + 1, top + 1), dtype=np.float64)
    ways[0, 0] = 1.0
    for r in doubled:
        ways[1:, r:] = ways[1:, r:] + ways[:-1, : top + 1 - r]
    null = ways[n1] / ways[n1].sum()
    observed = sum(doubled[:n1])
    below, above = float(null[: observed + 1].sum()), float(null[observed:].sum())
    return min(1.0, 2 * min(below, above))


def _asymptotic_p(u: float, n1: int, n2: int, tie_sizes: list[int]) -> float:
    n = n1 + n2
    tie_term = sum(t**3 - t for t in tie_sizes)
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:  # every value equal: nothing tells the samples apart
        return 1.0
    deviation = max(u, n1 * n2 - u) - n1 * n2 / 2 - 0.5  # continuity correction
    z = deviation / math.sqrt(variance)
    return min(1.0, math.erfc(z / math.sqrt(2)))  # 2 · P(Z > z)
