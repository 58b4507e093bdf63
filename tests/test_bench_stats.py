"""Benchmark statistics checked on known data (values worked out by hand, with numpy or with scipy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.stats import (
    EXACT_MAX_VALUES,
    bootstrap_speedup,
    drift_verdict,
    mann_whitney_u,
    percentile,
    repeats_for_significance,
    smallest_p_value,
    summarize,
)


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


def test_memory_given_back_is_no_drift() -> None:
    # start memory of a CI soak of the tiny seed table (MB): the allocator returned some after round 4
    given_back = [1252.5, 1258.2, 1127.1, 1091.8, 1258.3, 1091.8, 1091.8, 1091.8, 1091.8, 1259.0]
    verdict, change = drift_verdict(given_back, grows_only=True)
    assert verdict == "stable" and change < -0.05
    assert drift_verdict(given_back)[0] == "drifting"  # for time, a change either way is one
    assert drift_verdict([1000.0 + 20 * i for i in range(10)], grows_only=True)[0] == "drifting"


def test_memory_moving_between_two_levels_is_no_drift() -> None:
    # start memory (MiB) of a tiny seed table soak that was called drifting (+7.8 %): the first half
    # went 1042, 1200, 1042, 1200, so its median (1121) was below the level memory already kept
    two_levels = [1199.0, 1042.0, 1200.0, 1042.0, 1200.0, 1209.0, 1209.0, 1209.0, 1085.0, 1209.0]
    verdict, change = drift_verdict(two_levels, grows_only=True)
    assert verdict == "stable" and 0 < change < 0.02  # the median slope: +15 MiB over the soak
    assert drift_verdict([1042.0, 1200.0] * 3 + [1300.0] * 4, grows_only=True)[0] == "drifting"  # past both


def test_drift_verdict_on_flat_and_growing_series() -> None:
    assert drift_verdict([100.0] * 10)[0] == "stable"
    # memory that settles after the first round is no leak (a least-squares fit made this 6.4 %)
    assert drift_verdict([1093.0] + [1255.0] * 9) == ("stable", 0.0)
    assert drift_verdict([1255.0] * 9 + [1400.0])[0] == "stable"  # one late outlier neither
    # memory that jumped and stayed up for the last rounds is a drift, though the median slope is 0
    verdict, change = drift_verdict([100.0] * 14 + [200.0] * 6)
    assert verdict == "drifting" and change == pytest.approx(1.0)
    assert drift_verdict([100.0] * 10 + [200.0] * 4)[0] == "drifting"
    verdict, change = drift_verdict([100.0 + 2 * i for i in range(10)])  # +18 over 105 (rounds 1-4)
    assert verdict == "drifting"
    assert change == pytest.approx(18 / 105)
    with pytest.raises(ValueError, match="two rounds"):
        drift_verdict([1.0])


def test_summarize_and_percentile_reject_empty() -> None:
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_mann_whitney_n3_floor_is_one_tenth() -> None:
    """3 against 3, fully separated: 2 of the C(6, 3) = 20 rankings are that extreme, p = 0.1."""
    test = mann_whitney_u([10.0, 10.2, 9.8], [5.0, 7.0, 4.0])
    assert (test.u, test.method) == (9.0, "exact")
    assert test.p_value == pytest.approx(0.1)
    assert test.p_floor == pytest.approx(0.1)
    assert not test.significant and not test.can_be_significant
    assert smallest_p_value(4, 4) == pytest.approx(2 / 70)  # 0.029: 4 repeats can reach p < 0.05
    assert repeats_for_significance(0.05) == 4
    assert repeats_for_significance(0.01) == 5  # 2 / C(10, 5) = 0.0079


# (baseline, variant): distinct values, ties within and across the samples, all equal, unequal sizes.
KNOWN_SAMPLES = [
    ([68.9, 69.4, 68.1, 70.2, 69.0], [37.2, 36.8, 38.0, 37.5, 37.1]),
    ([1.0, 1.2, 0.9, 1.1], [1.05, 0.95, 1.15, 1.0]),
    ([3.1, 2.9, 3.3], [3.0, 3.4, 3.2, 3.5, 3.6, 2.8]),
    ([2.0, 2.0, 3.0, 4.0], [2.0, 3.0, 3.0, 5.0]),
    ([1.0, 1.0, 1.0], [1.0, 2.0, 2.0]),
    ([5.0, 5.0, 5.0], [5.0, 5.0, 5.0]),
    ([10.0, 11.0, 12.0, 12.0, 13.0, 14.0, 15.0], [12.0, 12.0, 16.0, 17.0, 18.0, 18.0, 19.0, 20.0]),
]


@pytest.mark.parametrize(("baseline", "variant"), KNOWN_SAMPLES)
def test_mann_whitney_exact_matches_scipy_permutation_test(
    baseline: list[float], variant: list[float]
) -> None:
    stats = pytest.importorskip("scipy.stats")
    ours = mann_whitney_u(baseline, variant)
    reference = stats.mannwhitneyu(baseline, variant, method=stats.PermutationMethod(n_resamples=np.inf))
    print(f"U={ours.u} p={ours.p_value:.6f} scipy p={reference.pvalue:.6f}")
    assert ours.method == "exact"
    assert ours.u == pytest.approx(float(reference.statistic))
    assert ours.p_value == pytest.approx(float(reference.pvalue), abs=1e-12)
    if len(set(baseline + variant)) == len(baseline + variant):  # no ties: scipy's exact U distribution
        exact = stats.mannwhitneyu(baseline, variant, method="exact")
        assert ours.p_value == pytest.approx(float(exact.pvalue), abs=1e-12)


def test_mann_whitney_asymptotic_matches_scipy_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    baseline = rng.integers(0, 12, size=30).astype(float).tolist()  # many ties: tie correction matters
    variant = rng.integers(3, 15, size=25).astype(float).tolist()
    assert len(baseline) + len(variant) > EXACT_MAX_VALUES
    ours = mann_whitney_u(baseline, variant)
    reference = stats.mannwhitneyu(baseline, variant, method="asymptotic")
    print(f"U={ours.u} p={ours.p_value:.6g} scipy p={reference.pvalue:.6g}")
    assert ours.method == "asymptotic"
    assert ours.u == pytest.approx(float(reference.statistic))
    assert ours.p_value == pytest.approx(float(reference.pvalue), rel=1e-9)
    assert ours.significant


def test_mann_whitney_rejects_empty_and_non_finite() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_u([1.0, float("nan")], [1.0])
