"""Per-variant results: the measured runs of a variant folded into the figures the report shows.

Example::

    result = build_variant_result("8-step distill", runs, baseline_times=[68.9, 69.3])
    print(result.total.median, result.speedup.ratio if result.speedup else None)
    print(result.significance.p_value if result.significance else None)   # Mann-Whitney U, two-sided
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from benchmarks.matrix import Matrix
from benchmarks.modes import compare_runs
from benchmarks.protocol import RunMeasure
from benchmarks.stats import RankTest, Speedup, Summary, bootstrap_speedup, mann_whitney_u, summarize


@dataclass(frozen=True)
class VariantResult:
    """One row of the table: a variant's runs and summaries, or why it was not run or failed."""

    name: str
    runs: tuple[RunMeasure, ...] = ()
    skipped: str | None = None
    failed: str | None = None  # the error of the run that failed; the variant's runs are dropped
    total: Summary | None = None
    speedup: Speedup | None = None
    significance: RankTest | None = None  # against the baseline; None for the baseline itself
    energy_wh: Summary | None = None
    peak_vram_bytes: Summary | None = None
    peak_rss_bytes: Summary | None = None
    phases: dict[str, float] = field(default_factory=dict)
    step_s: float | None = None
    flags: dict[str, int] = field(default_factory=dict)
    quality: dict[str, Any] | None = None

    @property
    def measured(self) -> list[RunMeasure]:
        return [run for run in self.runs if not run.warmup]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["runs"] = [run.to_json() for run in self.runs]
        if self.total is not None:
            data["total"]["spread_warning"] = self.total.spread_warning
        if self.speedup is not None:
            data["speedup"]["significant"] = self.speedup.significant
        if self.significance is not None:
            data["significance"] = {
                "test": "mann-whitney-u, two-sided",
                **data["significance"],
                "significant": self.significance.significant,
                "can_be_significant": self.significance.can_be_significant,
            }
        return data


def skipped_result(name: str, reason: str) -> VariantResult:
    return VariantResult(name=name, skipped=reason)


def failed_result(name: str, error: str) -> VariantResult:
    return VariantResult(name=name, failed=error)


def build_variant_result(
    name: str,
    runs: list[RunMeasure],
    baseline_times: list[float] | None,
    *,
    is_baseline: bool = False,
) -> VariantResult:
    """Summaries of the measured (non-warmup) runs; speed-up against ``baseline_times`` when given,
    and a Mann-Whitney U test against them unless this is the baseline (nothing to test)."""
    measured = [run for run in runs if not run.warmup]
    if not measured:
        raise ValueError(f"variant {name!r} has no measured runs")
    times = [run.total_s for run in measured]
    phase_names = sorted({phase for run in measured for phase in run.phases})
    steps = [run.step_s for run in measured if run.step_s is not None]
    flags: dict[str, int] = {}
    for run in measured:
        for flag in run.flags:
            flags[flag] = flags.get(flag, 0) + 1
    return VariantResult(
        name=name,
        runs=tuple(runs),
        total=summarize(times),
        # the baseline against itself is 1 by definition: its bootstrap interval would only be noise
        speedup=(Speedup(1.0, 1.0, 1.0) if is_baseline else bootstrap_speedup(baseline_times, times))
        if baseline_times
        else None,
        significance=mann_whitney_u(baseline_times, times) if baseline_times and not is_baseline else None,
        energy_wh=_maybe_summary([run.energy_wh for run in measured]),
        peak_vram_bytes=_maybe_summary([run.peak_vram_bytes for run in measured]),
        peak_rss_bytes=_maybe_summary([run.peak_rss_bytes for run in measured]),
        phases={
            phase: statistics.median(run.phases.get(phase, 0.0) for run in measured) for phase in phase_names
        },
        step_s=statistics.median(steps) if steps else None,
        flags=flags,
    )


def _maybe_summary(values: list[float | int | None]) -> Summary | None:
    present = [float(v) for v in values if v is not None]
    return summarize(present) if present else None


def fold_results(
    matrix: Matrix, runs: dict[str, list[RunMeasure]], skipped: dict[str, str], failed: dict[str, str]
) -> list[VariantResult]:
    """One result per variant of ``matrix``, in its order: skipped, failed, or measured (speed-up against
    the baseline's measured runs, frame quality against the reference's first output)."""
    baseline_runs = runs.get(matrix.baseline)
    baseline = [r.total_s for r in baseline_runs if not r.warmup] if baseline_runs else None
    reference = _first_measured(runs.get(matrix.reference, []))
    results = []
    for variant in matrix.variants:
        if variant.name in skipped:
            results.append(skipped_result(variant.name, skipped[variant.name]))
            continue
        if variant.name in failed:
            results.append(failed_result(variant.name, failed[variant.name]))
            continue
        if variant.name not in runs:
            results.append(skipped_result(variant.name, "not run"))
            continue
        is_baseline = variant.name == matrix.baseline
        result = build_variant_result(variant.name, runs[variant.name], baseline, is_baseline=is_baseline)
        run = _first_measured(runs[variant.name])
        quality = compare_runs(run, reference) if run and reference else None
        if quality:
            result = replace(result, quality=quality)
        results.append(result)
    return results


def _first_measured(runs: list[RunMeasure]) -> RunMeasure | None:
    return next((run for run in runs if not run.warmup and (run.output_path or run.frames_path)), None)
