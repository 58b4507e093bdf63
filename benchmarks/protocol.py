"""Run one variant by the protocol: warmups, repeats, cache defeat, memory-return check.

Per variant, on a server that already runs with the variant's flags:

1. ``warmups`` runs whose figures are kept (marked ``warmup``) but never reach the statistics;
2. ``repeats`` measured runs; before *every* run the cache is defeated with ``POST /free``:
   - ``warm``: ``{"free_memory": true, "unload_models": false}`` resets ComfyUI's node-output cache, so
     every node executes again, while models the model manager holds stay loaded;
   - ``cold``: ``{"free_memory": true, "unload_models": true}`` also unloads every model, so weights are
     read again (from the OS page cache: dropping that needs root and is not attempted);
3. prompt, seed, resolution and frames never change (the workflow is the same file each run); a run in
   which any node was still served from the cache is flagged ``cache_not_defeated``;
4. memory release is checked through the pack's telemetry: each measured run's start memory (NVML
   used bytes on a GPU, the server's RSS otherwise) must be within ``memory_tolerance_mb`` of the first
   measured run's; otherwise the run is flagged ``memory_not_returned``.

Example::

    runs = run_variant(matrix, variant, workflow_path, server_url, out_dir)
    print([r.total_s for r in runs if not r.warmup])
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks.matrix import Matrix, Variant
from runner.run import RunOptions, run_workflow

logger = logging.getLogger(__name__)

# The worker wakes on /free and applies it before taking the next prompt; a prompt queued before it
# woke would run first (then flagged cache_not_defeated), so leave it a moment.
FREE_SETTLE_S = 0.2
MB = 1024 * 1024


@dataclass(frozen=True)
class RunMeasure:
    """What the statistics need from one run record, plus where the record and the video are."""

    variant: str
    index: int
    warmup: bool
    total_s: float
    server_s: float | None
    phases: dict[str, float]
    step_s: float | None
    peak_vram_bytes: int | None
    peak_rss_bytes: int | None
    energy_wh: float | None
    memory_start_bytes: int | None
    memory_kind: str
    record_path: str
    output_path: str | None
    flags: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "flags": list(self.flags)}


def defeat_cache(server: str, mode: str, *, settle_s: float = FREE_SETTLE_S) -> None:
    """``POST /free`` as the module docstring says for ``mode`` (``warm`` or ``cold``)."""
    body = {"free_memory": True, "unload_models": mode == "cold"}
    response = httpx.post(f"{server}/free", json=body, timeout=30.0)
    response.raise_for_status()
    time.sleep(settle_s)


def measure_from_record(
    record: dict[str, Any], record_path: Path, variant: str, index: int, warmup: bool
) -> RunMeasure:
    """The :class:`RunMeasure` of one run record (``leanvideo.run`` v2)."""
    timing = record.get("timing", {})
    telemetry = record.get("telemetry", {})
    nodes = record.get("nodes", [])
    steps = [s for node in nodes for s in node.get("step_seconds") or []]
    flags = []
    if any(node.get("cached") for node in nodes):
        flags.append("cache_not_defeated")
    available = bool(telemetry.get("available"))
    nvml_start = telemetry.get("nvml_used_start_bytes") if available else None
    memory_start = nvml_start if nvml_start is not None else telemetry.get("rss_start_bytes")
    outputs = record.get("outputs", [])
    return RunMeasure(
        variant=variant,
        index=index,
        warmup=warmup,
        # The queue wait is left out: it holds whatever the worker still did for the cache defeat.
        total_s=float(timing.get("wall_s") or 0.0) - float(timing.get("queue_s") or 0.0),
        server_s=timing.get("server_execution_s"),
        phases=dict(timing.get("phases") or {}),
        step_s=statistics.median(steps) if steps else None,
        peak_vram_bytes=telemetry.get("cuda_max_reserved_bytes") if available else None,
        peak_rss_bytes=telemetry.get("peak_rss_bytes") if available else None,
        energy_wh=telemetry.get("energy_wh") if available else None,
        memory_start_bytes=memory_start if available else None,
        memory_kind="nvml_used" if nvml_start is not None else "rss",
        record_path=str(record_path),
        output_path=outputs[0].get("path") if outputs else None,
        flags=tuple(flags),
    )


def flag_memory_not_returned(runs: list[RunMeasure], tolerance_mb: float) -> list[RunMeasure]:
    """Flag measured runs whose start memory is above the first measured run's by more than tolerance."""
    measured = [r for r in runs if not r.warmup and r.memory_start_bytes is not None]
    if not measured:
        return runs
    baseline = measured[0].memory_start_bytes or 0
    flagged: list[RunMeasure] = []
    for run in runs:
        start = run.memory_start_bytes
        if not run.warmup and start is not None and start - baseline > tolerance_mb * MB:
            grew = (start - baseline) / MB
            logger.warning("%s run %d: memory %.0f MB above baseline", run.variant, run.index, grew)
            run = replace(run, flags=(*run.flags, "memory_not_returned"))
        flagged.append(run)
    return flagged


def run_variant(
    matrix: Matrix,
    variant: Variant,
    workflow_path: Path,
    server: str,
    out_dir: Path,
    *,
    warmups: int | None = None,
    repeats: int | None = None,
) -> list[RunMeasure]:
    """Run ``variant`` (its workflow already written to ``workflow_path``) on ``server``.

    Raises the runner's errors (:mod:`runner.errors`) when a run fails: a benchmark of a failing
    configuration has no meaning.
    """
    options = RunOptions(
        server=server, out_dir=out_dir, overrides=variant.overrides, timeout=matrix.timeout_s
    )
    total_warmups = matrix.warmups if warmups is None else warmups
    total_repeats = matrix.repeats if repeats is None else repeats
    runs: list[RunMeasure] = []
    for index in range(total_warmups + total_repeats):
        defeat_cache(server, matrix.mode)
        outcome = run_workflow(workflow_path, options)
        warmup = index < total_warmups
        runs.append(measure_from_record(outcome.record, outcome.record_path, variant.name, index, warmup))
        logger.info(
            "%s run %d%s: %.3f s", variant.name, index, " (warmup)" if warmup else "", runs[-1].total_s
        )
    return flag_memory_not_returned(runs, matrix.memory_tolerance_mb)
