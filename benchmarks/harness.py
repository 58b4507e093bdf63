"""Run a whole matrix: servers per launch-flag set, the protocol per variant, modes, then the reports.

Variants with the same ``server_args`` share one server; their runs are made in the run order
(``BenchSettings.order``, else the matrix's ``order``: ``interleaved`` by default, see
:mod:`benchmarks.protocol`). Each other set of flags gets a server of its own, started after the
previous one stopped, through :class:`runner.local.server.ComfyServer` (each with its own state folder under
``OUT/servers``). The report keeps the file order. With ``BenchSettings.servers`` set, the harness uses
the first of those running servers instead (``--load`` spreads over all of them) and skips variants
that need launch flags, saying so in the table.

Output folder layout::

    OUT/bench.json  report.md  report.csv  total_time.png  phases.png
    OUT/workflows/<variant>.api.json       the exact workflow each variant ran (overrides on top)
    OUT/runs/<variant>/<time-id>/run.json  one immutable run record per run, with its video

Example::

    outcome = run_matrix(load_matrix(Path("benchmarks/seed_table_tiny.toml")), BenchSettings(Path("out")))
    print(outcome.markdown_path.read_text())
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import modes
from benchmarks.bench_servers import (
    Placement,
    comfy_flags,
    given_server_flags,
    open_server,
    place_groups,
    server_groups,
    server_state_dir,
)
from benchmarks.caveats import comparison_caveats
from benchmarks.matrix import MAX_REPEATS, ORDERS, Matrix, Variant
from benchmarks.preflight import baseline_problems, matrix_problems
from benchmarks.protocol import (
    SERVER_LOST,
    RunMeasure,
    run_variants,
    server_failure_line,
)
from benchmarks.report import (
    PlotError,
    render_csv,
    render_markdown,
    run_context,
    write_plots,
)
from benchmarks.results import VariantResult, fold_results
from benchmarks.store import build_document, check_out_unused, write_document
from benchmarks.variant_workflow import prepare_jobs
from runner.errors import PromptCancelledError, ServerError, WorkflowError
from runner.graph.workflow import load_workflow, parse_override
from runner.jobs.run import collect_environment
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchSettings:
    """How to run a matrix (the CLI's options)."""

    out_dir: Path
    servers: tuple[str, ...] = ()
    warmups: int | None = None
    repeats: int | None = None
    order: str | None = None  # None: the matrix's
    plots: bool = True
    consistency: bool = False
    soak: int = 0
    load: bool = False
    concurrency: int = 2
    jobs: int = 8
    overrides: tuple[str, ...] = ()  # NODE.input=VALUE for every variant, after the variant's own
    budget_s: float | None = None  # no run (or soak/load) starts after this many seconds
    server_warmups: int = 0  # discarded runs of a group's first variant right after its server starts
    port: int | None = None  # of each server the bench starts, one after the other (None: a free one)
    # every request's (a proxy's --token and --header); in this process only: never in bench.json or a log
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for spec in self.overrides:
            parse_override(spec)  # raises WorkflowError naming the malformed --set
        if self.budget_s is not None and not self.budget_s > 0:  # NaN too
            raise ValueError(f"--budget-s must be > 0, got {self.budget_s:g}")
        if self.soak and self.soak < 10:
            raise ValueError(f"--soak needs at least 10 rounds, got {self.soak}")
        if self.warmups is not None and not 0 <= self.warmups <= MAX_REPEATS:
            raise ValueError(f"--warmups must be 0 to {MAX_REPEATS}, got {self.warmups}")
        if self.repeats is not None and not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(f"--repeats must be 1 to {MAX_REPEATS}, got {self.repeats}")
        if self.server_warmups < 0:
            raise ValueError(f"--server-warmups must be ≥ 0, got {self.server_warmups}")
        if self.concurrency < 1 or self.jobs < 1:
            raise ValueError(f"--concurrency and --jobs must be ≥ 1, got {self.concurrency}, {self.jobs}")
        if self.order is not None and self.order not in ORDERS:
            raise ValueError(f"--order must be one of {ORDERS}, got {self.order!r}")


@dataclass
class BenchOutcome:
    """What a matrix run produced."""

    results: list[VariantResult]
    document_path: Path
    markdown_path: Path
    csv_path: Path
    plot_paths: list[Path] = field(default_factory=list)
    plot_error: str | None = None
    modes: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    server_lost: list[str] = field(default_factory=list)  # a server stopped answering: runs are missing


@dataclass
class _Measured:
    """What the runs of a matrix produced, gathered group by group."""

    runs: dict[str, list[RunMeasure]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    modes: dict[str, Any] = field(default_factory=dict)
    sequence: int = 0  # the next run's place in the whole matrix's run order
    server_lost: list[str] = field(default_factory=list)  # servers that stopped answering mid-matrix
    interrupted: bool = False  # Ctrl-C or SIGTERM ended the matrix: the reports are of the runs made
    checked: bool = False  # the variants were checked against the first server's /object_info
    given: dict[str, tuple[str, ...]] = field(default_factory=dict)  # --server: url -> its launch flags
    placed: Placement = field(default_factory=dict)  # --server: each flag set's servers, or why none


def run_matrix(matrix: Matrix, settings: BenchSettings, progress: Progress | None = None) -> BenchOutcome:
    """Run every variant of ``matrix`` and write the reports; see the module docstring."""
    say = progress or (lambda message: logger.info("%s", message))
    started = time.perf_counter()
    check_out_unused(settings.out_dir)  # before any server starts
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    deadline = None if settings.budget_s is None else time.monotonic() + settings.budget_s
    base = load_workflow(matrix.workflow)  # an unreadable workflow fails before any server starts
    measured = _Measured()
    if settings.servers:  # each launch-flag set runs on a given server launched with it, if one is
        measured.given = given_server_flags(settings.servers, settings.headers)
        groups = [args for args, _ in server_groups(matrix.variants)]
        measured.placed = place_groups(groups, measured.given, comfy_flags())
    try:
        for server_args, group in server_groups(matrix.variants):
            _run_group(matrix, settings, base, server_args, group, measured, deadline, say)
    except (KeyboardInterrupt, PromptCancelledError):  # Ctrl-C, SIGTERM; in a prompt, said as cancelled
        # the groups measured before are reported: a long table is not all lost
        if measured.runs:
            measured.interrupted = True
            for variant in matrix.variants:
                if variant.name not in (*measured.runs, *measured.failed, *measured.skipped):
                    measured.skipped[variant.name] = "interrupted before its measured runs"
            written = _write_reports(matrix, settings, measured)
            say(f"interrupted: the report of the runs made is in {written.markdown_path}")
        raise
    for name, error in measured.failed.items():
        say(f"{name}: failed ({error})")
    _say_unrun_launch_checks(matrix, settings, measured)
    outcome = _write_reports(matrix, settings, measured)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _say_unrun_launch_checks(matrix: Matrix, settings: BenchSettings, measured: _Measured) -> None:
    """``--soak`` or ``--load`` asked for and not run: a verdict saying why (they were left out)."""
    for mode, asked in (("soak", settings.soak), ("load", settings.load)):
        if asked and mode not in measured.modes:
            measured.modes[mode] = {"verdict": f"not run: {_no_launch_checks(matrix, measured)}"}


def _no_launch_checks(matrix: Matrix, measured: _Measured) -> str:
    """Why ``--soak`` and ``--load`` (run on the baseline's server after its runs) did not run."""
    name = matrix.baseline
    if name in measured.skipped or name in measured.failed:
        why = measured.skipped.get(name) or measured.failed.get(name)
        return f"they run on the baseline {name!r}, which was not measured ({why})"
    if measured.server_lost:
        return "the baseline's server was lost"
    return "the time budget (--budget-s) ran out after the baseline's runs"


def _out_of_time(settings: BenchSettings) -> str:
    return f"the time budget (--budget-s {settings.budget_s or 0:g}) ran out before its measured runs"


def _run_group(
    matrix: Matrix,
    settings: BenchSettings,
    base: dict[str, Any],
    server_args: tuple[str, ...],
    group: list[Variant],
    measured: _Measured,
    deadline: float | None,
    say: Progress,
) -> None:
    """Start the server for ``server_args`` and run ``group`` on it; the figures go into ``measured``.
    A server that does not start or stops answering ends this group only (``measured.server_lost``)."""
    if isinstance(why_not := measured.placed.get(server_args), str):  # no --server fits, whatever the time
        measured.skipped.update({variant.name: why_not for variant in group})
        return
    if deadline is not None and time.monotonic() >= deadline:
        names = ", ".join(variant.name for variant in group)
        logger.warning(
            "time budget used up: not run (server flags %s): %s", " ".join(server_args) or "none", names
        )
        measured.skipped.update({variant.name: _out_of_time(settings) for variant in group})
        return
    out, started = settings.out_dir, False
    log = server_state_dir(out, server_args) / "comfyui.log"
    where = "" if settings.servers else f"; its log: {log}"
    try:
        with open_server(matrix, settings, server_args, out, say, measured.placed) as (url, why_not):
            if url is None:
                measured.skipped.update({variant.name: why_not for variant in group})
                return
            started = True
            _run_on_server(matrix, settings, base, group, measured, deadline, say, url, where)
    except ServerError as error:  # it did not start, or went away outside a measured run
        what = SERVER_LOST if started else SERVER_NOT_STARTED
        measured.server_lost.append(
            f"{what} ({' '.join(server_args) or 'default'}): {server_failure_line(error)}{where}"
        )
        for variant in group:
            if variant.name not in measured.runs and variant.name not in measured.failed:
                measured.skipped.setdefault(variant.name, f"{what} before its runs")
    finally:  # the log is complete once the server has stopped
        if started and settings.servers:  # said, not left out: the report's reader must not take it as clean
            for url in settings.servers:  # each of them (a --load sends jobs to all)
                measured.modes.setdefault("logs", {})[url] = {"verdict": LOGS_NOT_CHECKED}
        elif started and log.is_file():
            try:
                measured.modes.setdefault("logs", {})[" ".join(server_args) or "default"] = (
                    modes.scan_server_log(log)
                )
            except OSError as exc:  # reading a log must not hide what happened to the runs
                logger.warning("could not read %s: %s", log, exc)


INTERRUPTED = "interrupted (Ctrl-C or SIGTERM): the variants after it were not run"
SERVER_NOT_STARTED = "the server did not start"  # how a server lost before it answered is told
LOGS_NOT_CHECKED = "not checked: a server given with --server writes its log where the bench cannot see it"


def _run_on_server(
    matrix: Matrix,
    settings: BenchSettings,
    base: dict[str, Any],
    group: list[Variant],
    measured: _Measured,
    deadline: float | None,
    say: Progress,
    url: str,
    where: str,
) -> None:
    """The measured runs of ``group`` on ``url``, then the launch checks on the baseline's server."""
    with ComfyClient(url, headers=settings.headers) as client:
        measured.environment = measured.environment or collect_environment(client)
        object_info = client.get_json("/object_info")
    on_cpu = (measured.environment.get("device") or {}).get("type") == "cpu"
    if not measured.checked:  # every variant that will run, before the first run: a bad matrix runs nothing
        measured.checked = True
        runnable = [
            v
            for v in matrix.variants
            if not v.cpu_skip(on_cpu) and not isinstance(measured.placed.get(v.server_args), str)
        ]
        here = group[0].server_args
        problems = matrix_problems(runnable, base, object_info, settings.overrides, server_args=here)
        first = matrix.variant(matrix.baseline)
        unplaced = {args: why for args, why in measured.placed.items() if isinstance(why, str)}
        if problems := baseline_problems(first, runnable, on_cpu, matrix.variants, unplaced) + problems:
            listed = "\n  ".join(problems)
            raise WorkflowError(f"{matrix.path}: {len(problems)} problem(s); nothing was run:\n  {listed}")
    extended = [replace(v, overrides=v.overrides + settings.overrides) for v in group]
    jobs = prepare_jobs(
        extended, base, object_info, settings.out_dir, on_cpu, measured.skipped, measured.failed, say
    )
    if not jobs:
        return
    order = settings.order or matrix.order
    say(f"{', '.join(job.variant.name for job in jobs)}: running ({order}) on {url}")
    lost: list[str] = []
    group_runs = run_variants(
        matrix,
        jobs,
        url,
        order=order,
        warmups=settings.warmups,
        repeats=settings.repeats,
        first_sequence=measured.sequence,
        failures=measured.failed,
        deadline=deadline,
        server_warmups=settings.server_warmups,
        on_server_lost=lambda message: lost.append(message + where),
        headers=settings.headers,
    )
    measured.sequence += sum(len(variant_runs) for variant_runs in group_runs.values())
    measured.server_lost += lost
    for name, variant_runs in group_runs.items():
        if not all(run.warmup for run in variant_runs):
            measured.runs[name] = variant_runs
        else:
            measured.skipped[name] = f"{SERVER_LOST} before its runs" if lost else _out_of_time(settings)
    baseline = next((job for job in jobs if job.variant.name == matrix.baseline), None)
    in_time = deadline is None or time.monotonic() < deadline
    if baseline is None or baseline.variant.name not in measured.runs or lost or not in_time:
        return  # no launch check on a server that is gone, or past the budget
    measured.modes.update(
        modes.run_launch_checks(
            matrix,
            baseline,
            url,
            settings.out_dir,
            soak=settings.soak,
            load=settings.load,
            servers=_servers_of(measured.placed.get(baseline.variant.server_args)) or (url,),
            concurrency=settings.concurrency,
            jobs=settings.jobs,
            deadline=deadline,
            say=say,
            on_server_lost=lambda message: measured.server_lost.append(message + where),
            headers=settings.headers,
        )
    )


def _write_reports(matrix: Matrix, settings: BenchSettings, measured: _Measured) -> BenchOutcome:
    """bench.json, report.md, report.csv and the plots of what was measured."""
    out = settings.out_dir
    results = fold_results(matrix, measured.runs, measured.skipped, measured.failed)
    if settings.consistency:
        measured.modes["consistency"] = {
            name: modes.check_consistency(r) for name, r in measured.runs.items()
        }
    environment = {**measured.environment, **({"given_servers": measured.given} if measured.given else {})}
    document = build_document(
        matrix,
        results,
        environment,
        modes=measured.modes,
        warmups=settings.warmups,
        repeats=settings.repeats,
    )
    document["matrix"]["order"] = settings.order or matrix.order
    document["matrix"]["overrides"] = list(settings.overrides)  # --set: the workflows that ran differ
    document["server_lost"], document["interrupted"] = measured.server_lost, measured.interrupted
    document_path = write_document(document, out / "bench.json")
    ended = [*measured.server_lost, *([INTERRUPTED] if measured.interrupted else [])]
    context = run_context(matrix, settings, environment) + [f"**{m}**" for m in ended]
    context += comparison_caveats(matrix, results, environment.get("device"))
    markdown_path = out / "report.md"
    markdown = render_markdown(results, title=matrix.path.stem, context=context, modes=measured.modes)
    markdown_path.write_text(markdown, "utf-8")
    csv_path = out / "report.csv"
    csv_path.write_text(render_csv(results), encoding="utf-8")
    outcome = BenchOutcome(
        results,
        document_path,
        markdown_path,
        csv_path,
        modes=measured.modes,
        server_lost=measured.server_lost,
    )
    if settings.plots:
        try:
            outcome.plot_paths = write_plots(results, out)
        except PlotError as exc:
            outcome.plot_error = str(exc)
    return outcome


def _servers_of(placed: tuple[str, ...] | str | None) -> tuple[str, ...]:
    return placed if isinstance(placed, tuple) else ()
