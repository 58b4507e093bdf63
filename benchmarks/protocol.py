"""Run variants by the protocol: warmups, repeats, run order, cache defeat, memory-return check.

Per group of variants sharing one server that already runs with their flags:

1. ``warmups`` runs per variant whose figures are kept (marked ``warmup``) but never reach the
   statistics;
2. ``repeats`` measured runs per variant, in the group's run order (:func:`plan_runs`):
   - ``interleaved`` (the default): every variant's warmups, then the measured runs round-robin
     (repeat 1 of A, B, C, then repeat 2 of A, B, C …), so drift of the machine (heat, a busy
     neighbour) spreads over every variant instead of biasing the one that ran while it lasted;
   - ``sequential``: each variant's warmups and repeats back to back, variants in file order;
3. before *every* run the cache is defeated with ``POST /free``:
   - ``warm``: ``{"free_memory": true, "unload_models": false}`` resets ComfyUI's node-output cache, so
     every node executes again, while models the model manager holds stay loaded;
   - ``cold``: ``{"free_memory": true, "unload_models": true}`` also unloads every model, so weights are
     read again (from the OS page cache: dropping that needs root and is not attempted);
4. prompt, seed, resolution and frames never change (the workflow is the same file each run); a run in
   which any node was still served from the cache is flagged ``cache_not_defeated``;
5. memory release is checked through the pack's telemetry: each measured run's start memory (NVML
   used bytes on a GPU, the server's RSS otherwise) must be within ``memory_tolerance_mb`` of the same
   variant's first measured run's (second, without warmups); otherwise it is ``memory_not_returned``.

Every run carries ``sequence``, its place in the whole matrix's run order, so the order can be checked.

Example::

    runs = run_variant(matrix, VariantRun(variant, workflow_path, out_dir), server_url)
    print([r.total_s for r in runs if not r.warmup])
    plan = plan_runs(["A", "B"], warmups=1, repeats=2, order="interleaved")
    print([f"{r.variant}{r.index}{'w' if r.warmup else ''}" for r in plan])   # A0w B0w A1 B1 A2 B2
"""

from __future__ import annotations

import logging
import statistics
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.caveats import attention_flags
from benchmarks.matrix import ORDERS, Matrix, Variant
from runner.errors import (
    PromptCancelledError,
    PromptFailedError,
    ServerCrashedError,
    ServerError,
    WorkflowError,
)
from runner.graph.workflow import Override
from runner.jobs.run import RunOptions, run_workflow
from runner.tracking.record import int8_kernels_measured
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

# The worker applies /free between prompts; a prompt queued before it did would run first (and be
# flagged cache_not_defeated). With the pack loaded, GET /leanvideo/queue says when the request has been
# applied; without it (a foreign --server) the harness can only leave the worker a moment.
FREE_SETTLE_S = 0.2
FREE_POLL_S = 0.05
FREE_APPLY_TIMEOUT_S = 600.0  # a prompt already running (another client's) delays the reset this long
# ComfyUI's worker reads the flags only after its queue wait returns, and /free wakes that wait with a
# notify that is lost when the worker is busy between prompts (its gc.collect()): it then sleeps up to
# 1000 s with the flags pending. Posting /free again (the flags are idempotent) wakes it.
FREE_REPOST_S = 2.0
MB = 1024 * 1024
SERVER_LOST = "the server stopped answering"  # how a failure because the server went away begins
LOSSLESS_ID = "bench_lossless"  # the Save Video (lossless) node the bench adds (modes.add_lossless_capture)


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
    sequence: int | None = None  # place in the matrix's run order (0-based, warmups included)
    frames_path: str | None = None  # the lossless copy of the video the bench adds (modes.LOSSLESS_ID)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "flags": list(self.flags)}


def defeat_cache(
    client: ComfyClient,
    mode: str,
    *,
    settle_s: float = FREE_SETTLE_S,
    timeout_s: float = FREE_APPLY_TIMEOUT_S,
) -> None:
    """``POST /free`` as the module docstring says for ``mode`` (``warm`` or ``cold``), then wait until
    the worker has applied it (``GET /leanvideo/queue`` lists no pending flag), or ``settle_s`` on a
    server without the pack. Raises :class:`~runner.errors.ServerError` when the server does not answer
    or refuses."""
    request = {"free_memory": True, "unload_models": mode == "cold"}
    client.post_json("/free", request)
    posted = time.monotonic()
    deadline = posted + timeout_s
    while True:
        queue = client.get_json("/leanvideo/queue", missing_ok=True)
        if queue is None:  # a server without the pack
            time.sleep(settle_s)
            return
        if not queue.get("pending_flags"):
            return
        now = time.monotonic()
        if now > deadline:
            logger.warning(
                "%s has not applied POST /free after %.0f s; running anyway", client.base_url, timeout_s
            )
            return
        if now - posted > FREE_REPOST_S:  # the worker may have missed the wake-up (see FREE_REPOST_S)
            client.post_json("/free", request)
            posted = now
        time.sleep(FREE_POLL_S)


@dataclass(frozen=True)
class PlannedRun:
    """One run in a group's schedule: the ``index``-th run (warmups first) of ``variant``."""

    variant: str
    index: int
    warmup: bool

    @property
    def said(self) -> str:
        """How a message names it, counting from 1: ``run 2`` (its warmups included), ``server warmup 1``."""
        return f"server warmup {-self.index}" if self.index < 0 else f"run {self.index + 1}"


@dataclass(frozen=True)
class VariantRun:
    """A variant ready to run: its workflow file (inserts and overrides applied), its run-record folder
    and the overrides written into that file, with the values they replaced (for each run's record)."""

    variant: Variant
    workflow_path: Path
    out_dir: Path
    applied: tuple[Override, ...] = ()


def plan_runs(variants: Sequence[str], warmups: int, repeats: int, order: str) -> list[PlannedRun]:
    """The order of the runs of ``variants`` (sharing one server); see the module docstring.

    Example: ``plan_runs(["A", "B"], 1, 2, "interleaved")`` is A0w B0w A1 B1 A2 B2, and with
    ``"sequential"`` A0w A1 A2 B0w B1 B2 (``w``: warmup).
    """
    if order not in ORDERS:
        raise ValueError(f"run order must be one of {ORDERS}, got {order!r}")
    if warmups < 0 or repeats < 1:
        raise ValueError(f"warmups must be ≥ 0 and repeats ≥ 1, got {warmups} and {repeats}")
    if len(set(variants)) != len(variants):
        raise ValueError(f"variant names must be unique, got {list(variants)}")
    if order == "sequential":
        return [
            PlannedRun(name, index, index < warmups)
            for name in variants
            for index in range(warmups + repeats)
        ]
    warm = [PlannedRun(name, index, True) for name in variants for index in range(warmups)]
    measured = [
        PlannedRun(name, index, False) for index in range(warmups, warmups + repeats) for name in variants
    ]
    return warm + measured


def measure_from_record(
    record: dict[str, Any],
    record_path: Path,
    variant: str,
    index: int,
    warmup: bool,
    *,
    sequence: int | None = None,
) -> RunMeasure:
    """The :class:`RunMeasure` of one run record (``leanvideo.run`` v2)."""
    timing = record.get("timing", {})
    telemetry = record.get("telemetry", {})
    nodes = record.get("nodes", [])
    steps = [s for node in nodes for s in node.get("step_seconds") or []]
    flags = []
    if any(node.get("cached") for node in nodes):
        flags.append("cache_not_defeated")
    if int8_kernels_measured(telemetry):
        # path=auto timed its INT8 kernels in this run (first use of a layer shape on this server, and
        # on a GPU int_mm_fused's compile): its time holds that, a later run's does not
        flags.append("int8_first_use")
    flags += attention_flags(telemetry)
    available = bool(telemetry.get("available"))
    nvml_start = telemetry.get("nvml_used_start_bytes") if available else None
    memory_start = nvml_start if nvml_start is not None else telemetry.get("rss_start_bytes")
    outputs = [o for o in record.get("outputs", []) if o.get("node_id") != LOSSLESS_ID]
    lossless = [o for o in record.get("outputs", []) if o.get("node_id") == LOSSLESS_ID]
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
        sequence=sequence,
        frames_path=lossless[0].get("path") if lossless else None,
    )


def flag_memory_not_returned(runs: list[RunMeasure], tolerance_mb: float) -> list[RunMeasure]:
    """Flag measured runs whose start memory is above the first measured run's by more than tolerance
    (the second's without a warmup: the first may have started on a fresh server, nothing loaded)."""
    measured = [r for r in runs if not r.warmup and r.memory_start_bytes is not None]
    first = 0 if any(r.warmup for r in runs) else 1
    if len(measured) <= first:
        return runs
    baseline = measured[first].memory_start_bytes or 0
    flagged: list[RunMeasure] = []
    for run in runs:
        start = run.memory_start_bytes
        if run in measured[first:] and start is not None and start - baseline > tolerance_mb * MB:
            grew = (start - baseline) / MB
            logger.warning("%s run %d: memory %.0f MB above baseline", run.variant, run.index + 1, grew)
            run = replace(run, flags=(*run.flags, "memory_not_returned"))
        flagged.append(run)
    return flagged


def run_once(
    matrix: Matrix,
    job: VariantRun,
    server: str,
    *,
    index: int,
    warmup: bool,
    sequence: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> RunMeasure:
    """One run of ``job``'s variant: defeat the cache (``matrix.mode``), run its workflow file (which
    holds the variant's overrides: they are recorded, not applied again), measure the record.

    Raises the runner's errors (:mod:`runner.errors`) when the run fails: a benchmark of a failing
    configuration has no meaning. ``headers`` go with every request (a proxy's ``--token``).
    """
    options = RunOptions(
        server=server, out_dir=job.out_dir, prior_overrides=job.applied, timeout=matrix.timeout_s,
        headers=tuple((headers or {}).items()),
    )  # fmt: skip
    with options.make_client() as client:
        defeat_cache(client, matrix.mode)
    outcome = run_workflow(job.workflow_path, options)
    run = measure_from_record(
        outcome.record, outcome.record_path, job.variant.name, index, warmup, sequence=sequence
    )
    logger.info("%s run %d%s: %.3f s", job.variant.name, index, " (warmup)" if warmup else "", run.total_s)
    return run


def one_line(error: BaseException, width: int = 300) -> str:
    """An error's message for a report cell: its lines joined (with "; " where a line does not end a
    sentence: a list of problems stays apart), cut at a word within ``width``."""
    text = ""
    for line in (" ".join(line.split()) for line in str(error).splitlines()):
        if line:
            text += ("" if not text else " " if text[-1] in ".:;!?" else "; ") + line
    short = textwrap.shorten(text, width, placeholder=" …")
    if len(text) > width and len(short) < width // 2:  # a long word (a path) would be dropped whole
        short = text[: width - 2] + " …"
    return short


def server_failure_line(error: ServerError) -> str:
    """A server failure for the report: a crash during start-up as its first line and the log's last
    line, where ComfyUI says why (``unrecognized arguments: --bogus-flag``); cut to one line at the
    middle, that last line was lost."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, ServerCrashedError) and len(lines) > 2:
        return one_line(ServerCrashedError(f"{lines[0]} … {lines[-1]}"))
    return one_line(error)


def run_variant(
    matrix: Matrix,
    job: VariantRun,
    server: str,
    *,
    warmups: int | None = None,
    repeats: int | None = None,
    deadline: float | None = None,
    failures: dict[str, str] | None = None,
    on_server_lost: Callable[[str], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[RunMeasure]:
    """Run ``job`` (its workflow already written) on ``server``, its runs back to back (soak rounds),
    none started after ``deadline``; ``failures`` and ``on_server_lost`` as in :func:`run_variants`
    (without them a failing run raises, see :func:`run_once`)."""
    runs = run_variants(
        matrix, [job], server, order="sequential", warmups=warmups, repeats=repeats, deadline=deadline,
        failures=failures, on_server_lost=on_server_lost, headers=headers,
    )  # fmt: skip
    return runs.get(job.variant.name, [])


def run_variants(
    matrix: Matrix,
    jobs: Sequence[VariantRun],
    server: str,
    *,
    order: str,
    warmups: int | None = None,
    repeats: int | None = None,
    first_sequence: int | None = None,
    failures: dict[str, str] | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    server_warmups: int = 0,
    on_server_lost: Callable[[str], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, list[RunMeasure]]:
    """Run ``jobs`` (variants sharing ``server``) in ``order``; each variant's runs by index.

    ``first_sequence`` numbers the runs in the order they ran (``None``: not numbered). Without
    ``failures`` a failing run raises (see :func:`run_once`). With it, a variant whose prompt fails or
    is rejected (an optimisation that does not work on this machine: a compile error, out of memory)
    gets its error in ``failures``, its runs dropped and its remaining runs cancelled, and the other
    variants go on. When the server stops answering, a run raises without ``on_server_lost``; with
    it, it is told (a message beginning with :data:`SERVER_LOST`), no other run is made, and the runs
    made so far are returned.
    No run starts after ``deadline`` (read from ``clock``): the runs made so far are returned.
    ``server_warmups`` discarded runs of the first job's variant come before everything else.
    ``headers`` go with every request to ``server`` (``--token`` and ``--header`` of a proxy).
    """
    total_warmups = matrix.warmups if warmups is None else warmups
    total_repeats = matrix.repeats if repeats is None else repeats
    by_name = {job.variant.name: job for job in jobs}
    runs: dict[str, list[RunMeasure]] = {name: [] for name in by_name}
    schedule = plan_runs(list(by_name), total_warmups, total_repeats, order)
    # Server warmups come first, on the first variant, indexed -1, -2 …: they absorb what only the
    # server's first prompt pays (CUDA context, library initialisation) and never reach the statistics.
    first = next(iter(by_name))
    schedule = [PlannedRun(first, -1 - i, True) for i in range(server_warmups)] + schedule

    def left(position: int) -> int:  # planned runs not made when the loop ends at ``position``
        return sum(1 for later in schedule[position:] if later.variant in runs)  # failed ones: cancelled

    for position, planned in enumerate(schedule):
        if deadline is not None and clock() >= deadline:
            logger.warning("time budget used up: %d planned run(s) on %s not made", left(position), server)
            break
        if planned.variant not in runs:  # failed earlier
            continue
        job = by_name[planned.variant]
        sequence = None if first_sequence is None else first_sequence + position
        try:
            run = run_once(
                matrix,
                job,
                server,
                index=planned.index,
                warmup=planned.warmup,
                sequence=sequence,
                headers=headers,
            )
        except PromptCancelledError:
            raise  # Ctrl-C stops the bench, it does not fail a variant
        except (PromptFailedError, WorkflowError) as error:
            if failures is None:
                raise
            message = one_line(error)
            failures[planned.variant] = f"{type(error).__name__} in {planned.said}: {message}"
            logger.warning("%s failed: %s", planned.variant, failures[planned.variant])
            del runs[planned.variant]
            continue
        except ServerError as error:
            if on_server_lost is None:
                raise
            message = one_line(error)
            where = f"{planned.said} of {planned.variant}"
            on_server_lost(f"{SERVER_LOST} in {where}: {message}; {left(position)} planned run(s) not made")
            break  # no run can follow on a server that is gone; the runs made are kept
        runs[planned.variant].append(run)
    return {name: flag_memory_not_returned(r, matrix.memory_tolerance_mb) for name, r in runs.items()}
