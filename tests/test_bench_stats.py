"""Benchmark statistics checked on known data (values worked out by hand or with numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.stats import bootstrap_speedup, drift_verdict, percentile, summarize


def test_percentile_matches_numpy_linear_interpolation() -> None:
    data = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for q in (0, 10, 25, 50, 90, 100):
        assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)))


def test_summarize_known_sample() -> None:
    summary = summarize([10.0, 11.0, 12.0, 13.0, 14.0])
    assert (summary.n, summary.median, summary.mean) == (5, 12.0, 12.0)
    assert summary.p10 == pytest.approx(10.4)
    assert summary.p90 == pytest.approx(13.6)
    assert summary.stdev == pytest.approx(math.sqrt(2.5))
    assert summary.spread_warning  # 1.58 / 12 = 13.2 % of the mean


def test_spread_warning_at_ten_percent_of_mean() -> None:
    tight = summarize([9.9, 10.0, 10.1])  # stdev 0.1, 1 % of the mean
    wide = summarize([8.0, 10.0, 12.0])  # stdev 2.0, 20 % of the mean
    assert not tight.spread_warning
    assert wide.spread_warning
    assert wide.spread_ratio == pytest.approx(0.2)
    assert not summarize([5.0]).spread_warning  # one value: no spread to judge


def test_bootstrap_speedup_of_constant_samples_is_exact() -> None:
    speedup = bootstrap_speedup([10.0, 10.0, 10.0], [5.0, 5.0, 5.0])
    assert (speedup.ratio, speedup.low, speedup.high) == (2.0, 2.0, 2.0)
    assert speedup.significant


def test_bootstrap_speedup_interval_brackets_the_ratio_and_repeats() -> None:
    baseline = [68.9, 69.4, 68.1, 70.2, 69.0]
    variant = [37.2, 36.8, 38.0, 37.5, 37.1]
    first = bootstrap_speedup(baseline, variant, seed=1)
    again = bootstrap_speedup(baseline, variant, seed=1)
    print(f"speed-up {first.ratio:.3f} [{first.low:.3f}–{first.high:.3f}]")
    assert first == again
    assert first.ratio == pytest.approx(69.0 / 37.2)
    assert first.low <= first.ratio <= first.high
    assert first.low > 1.7 and first.high < 2.0
    assert first.significant


def test_bootstrap_speedup_of_overlapping_samples_is_not_significant() -> None:
    speedup = bootstrap_speedup([1.0, 1.2, 0.9, 1.1], [1.05, 0.95, 1.15, 1.0])
    assert not speedup.significant


def test_bootstrap_speedup_rejects_empty_or_non_positive() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_speedup([], [1.0])
    with pytest.raises(ValueError, match="positive"):
        bootstrap_speedup([1.0], [0.0])


def test_drift_verdict_on_flat_and_growing_series() -> None:
    assert drift_verdict([100.0] * 10)[0] == "stable"
    verdict, change = drift_verdict([100.0 + 2 * i for i in range(10)])  # +18 over ~104
    assert verdict == "drifting"
    assert change == pytest.approx(18 / 104)
    with pytest.raises(ValueError, match="two rounds"):
        drift_verdict([1.0])


def test_summarize_and_percentile_reject_empty() -> None:
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        percentile([1.0], 101)
