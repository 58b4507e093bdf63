"""Wall time of callables, pyperf-style: warmup discarded, median and p10/p90 of the measured runs
(:func:`benchmarks.stats.summarize`), a flag where the spread is ≥ 10 % of the mean; ``sync`` waits for
queued device work (``torch.cuda.synchronize``) around every timed sample; ``calls`` > 1 makes a sample
that many calls back to back (on a GPU: launches queue behind each other as in a model, instead of
every call paying the launch latency a sync exposes), its time divided by ``calls``.

Example::

    timing = measure(lambda: model(x), runs=7, sync=torch.cuda.synchronize)
    timings = measure_interleaved({"a": run_a, "b": run_b}, runs=9)
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.stats import summarize


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    runs: int
    unstable: bool  # stdev ≥ 10 % of the mean

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        summary = summarize(samples)
        return cls(summary.median, summary.p10, summary.p90, summary.n, summary.spread_warning)


def measure(
    function: Callable[[], object], *, warmups: int = 1, runs: int = 5, sync: Callable[[], None] | None = None
) -> Timing:
    """Median and spread of ``function``'s wall time; ``sync`` waits for queued device work."""
    wait = sync or (lambda: None)
    for _ in range(warmups):
        function()
    wait()
    values = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        wait()
        values.append(time.perf_counter() - started)
    return Timing.of(values)


def sample_interleaved(
    functions: dict[str, Callable[[], object]],
    *,
    runs: int,
    sync: Callable[[], None] | None = None,
    calls: int = 1,
) -> dict[str, list[float]]:
    """Each function's ``runs`` samples (seconds per call), timed in interleaved rounds (each function
    once per round, in a new seeded order each round), so that load from other processes falls on every
    path alike; sample ``i`` of every function comes from round ``i`` (see :func:`paired_ratio`). A call
    pays for what the call before it left behind (W8A16 frees a dequantized weight, and the next call's
    allocations fault in fresh pages), so each timed sample follows an untimed call of the same
    function, as in a model, where one kernel runs layer after layer. A sample is ``calls`` calls back
    to back, then ``sync``; its value is the time per call."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    wait = sync or (lambda: None)
    for function in functions.values():
        function()
    wait()
    values: dict[str, list[float]] = {label: [] for label in functions}
    order = list(functions)
    shuffle = random.Random(0).shuffle
    for _ in range(runs):
        shuffle(order)
        for label in order:
            function = functions[label]
            function()
            wait()
            started = time.perf_counter()
            for _ in range(calls):
                function()
            wait()
            values[label].append((time.perf_counter() - started) / calls)
    return values


def measure_interleaved(
    functions: dict[str, Callable[[], object]],
    *,
    runs: int,
    sync: Callable[[], None] | None = None,
    calls: int = 1,
) -> dict[str, Timing]:
    """Like :func:`measure` for several functions, timed as :func:`sample_interleaved` times them."""
    samples = sample_interleaved(functions, runs=runs, sync=sync, calls=calls)
    return {label: Timing.of(values) for label, values in samples.items()}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median over rounds of ``numerator[i] / denominator[i]``: two paths timed in the same rounds
    (:func:`sample_interleaved`) compared round by round, so that drift between rounds (another
    process's burst, a clock change) cancels instead of landing on one median and not the other."""
    if len(numerator) != len(denominator) or not numerator:
        counts = f"{len(numerator)} and {len(denominator)}"
        raise ValueError(f"need as many samples of each path, at least one, not {counts}")
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))
