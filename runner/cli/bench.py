"""``leanvideo bench MATRIX.toml``: the benchmark harness's command line (parse, call, render).

The harness itself is the ``benchmarks`` package, installed with LeanVideo beside the matrices it runs.
The CLI is the only part of ``runner`` that may import it (an import contract says so).

Example::

    leanvideo bench benchmarks/seed_table_tiny.toml --out bench-out
    leanvideo bench benchmarks/seed_table_tiny.toml --soak 10 --load --concurrency 2 --jobs 8
    leanvideo bench M.toml --order sequential --repeats 5      # each variant's runs back to back
    python -m runner.cli.bench benchmarks/seed_table_tiny.toml      # the same, without the main CLI
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from runner.cli.render import (
    INTERRUPTED,
    PipeConsole,
    broken_pipe_exit,
    error_type,
    failure_label,
    print_json,
    print_json_error,
)
from runner.cli.server_options import (
    AppendServer,
    add_auth_arguments,
    check_int8_kernel_variable,
    given_path,
    override_spec,
    port_number,
    positive_seconds,
    request_headers,
    server_url,
)
from runner.cli.signals import stop_signals
from runner.errors import (
    LeanVideoError,
    PromptFailedError,
    PromptTimeoutError,
    ServerError,
    UsageError,
    WorkflowError,
    WorkspaceError,
)
from runner.local.out_folder import check_out_folder, remove_empty_folders
from runner.local.ports import port_is_free
from runner.tracking.follow import close_socket
from runner.transport.client import ComfyClient, WebsocketRefused


def add_bench_parser(subparsers: Any) -> None:
    """Add the ``bench`` sub-command to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark a matrix of workflow variants (time, speed-up, energy, peak memory)",
        description=(
            "Run every variant of MATRIX.toml by the benchmark protocol (warmups, repeats, cache "
            "defeat, memory check) and write bench.json, report.md, report.csv, plots and run records."
        ),
        epilog="exit codes: 0 every variant measured, 1 nothing measured, 2 usage (an --out, --port or "
        "option that cannot be used), 3 not installed, 4 a server lost (reports of the runs made written) "
        "or unreachable, 5 matrix or --set rejected (nothing run), 6 a variant failed (reports written), "
        "7 --budget-s ran out first, 130 interrupted (docs/benchmarks.md)",
    )
    parser.add_argument("matrix", type=Path, help="matrix file (see docs/benchmarks.md)")
    parser.add_argument(
        "--out", type=given_path, default=None, help="output folder (default: bench-out/<matrix>)"
    )
    parser.add_argument(
        "--server",
        type=server_url,
        action=AppendServer,
        default=[],
        help="use this running server instead of starting ours (repeat for --load over several): each "
        "variant runs on the first given server launched with its flags and none of the other variants' "
        "(as its /system_stats says), else it is skipped (the baseline: refused, exit 5)",
    )
    add_auth_arguments(parser, where=" in front of every --server")
    parser.add_argument(
        "--port",
        type=port_number,
        default=None,
        help="the port of the servers the bench starts, one after the other (default: a free one each)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        type=override_spec,
        default=[],
        metavar="NODE.INPUT=VALUE",
        help="set an input in every variant, after the variant's own (NODE.input=VALUE, NODE an id, title or "
        "unique class: EmptyLTXVLatentVideo.width=512); repeatable",
    )
    parser.add_argument(
        "--budget-s",
        type=positive_seconds,  # nan meant no limit
        default=None,
        metavar="SECONDS",
        help="start no run after this many seconds; the report covers the runs made (default: no limit)",
    )
    parser.add_argument(
        "--variant",
        dest="variants",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this variant (name or slug, e.g. 8-step-graph-compile; repeatable); the baseline "
        "and the quality reference always run too",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="NAME",
        help="measure speed-ups and frame quality against this variant instead of the matrix's baseline",
    )
    parser.add_argument(
        "--server-warmups",
        type=int,
        default=0,
        metavar="N",
        help="discard N runs of each server's first variant before its measured runs (right after it "
        "starts, for the servers the bench starts; default 0)",
    )
    parser.add_argument("--warmups", type=int, default=None, help="override the matrix's warmups")
    parser.add_argument("--repeats", type=int, default=None, help="override the matrix's repeats")
    parser.add_argument(
        "--order",
        choices=("interleaved", "sequential"),
        default=None,
        help="run order of the variants sharing a server: measured runs round-robin (interleaved) or "
        "each variant's runs back to back (sequential); default: the matrix's order, else interleaved",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (matplotlib)")
    parser.add_argument("--soak", type=int, default=0, metavar="N", help="soak the baseline N (≥ 10) rounds")
    parser.add_argument("--load", action="store_true", help="load-test the baseline variant")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="concurrent clients for --load (default 2)"
    )
    parser.add_argument("--jobs", type=int, default=None, help="jobs submitted by --load (default 8)")
    parser.add_argument(
        "--consistency", action="store_true", help="check that the same seed gives the same frames"
    )
    parser.add_argument("--json", action="store_true", help="print bench.json instead of the table")


def run_bench(args: argparse.Namespace, console: Console) -> int:
    """Run ``leanvideo bench``; returns the exit code (errors propagate as :mod:`runner.errors`)."""
    try:
        from benchmarks.harness import BenchSettings, run_matrix
        from benchmarks.matrix import load_matrix, select_variants
        from benchmarks.store import check_out_unused
    except ImportError as exc:
        raise WorkspaceError(f"`leanvideo bench` needs LeanVideo's benchmarks package: {exc}") from exc

    if not args.server:  # servers of its own, started under this environment
        check_int8_kernel_variable(os.environ)
    headers = request_headers(args)  # in this process only: never in bench.json, a record or a log
    if args.port is not None and args.server:
        raise UsageError("--port is the port of the servers the bench starts: leave it out with --server")
    if args.port is not None and not port_is_free("127.0.0.1", args.port):
        raise UsageError(f"--port {args.port} is in use: choose a free one (or leave --port out)")
    if not args.load and (args.concurrency is not None or args.jobs is not None):
        raise UsageError("--concurrency and --jobs set up --load: add --load, or leave them out")
    matrix = select_variants(load_matrix(args.matrix.resolve()), args.variants, args.baseline)
    repeats = args.repeats if args.repeats is not None else matrix.repeats
    if args.consistency and repeats < 2:  # said before the runs, not as the verdict after them
        raise UsageError(
            f"--consistency compares each variant's measured runs, and there would be {repeats}: give "
            "--repeats 2 or more"
        )
    out = (args.out or Path("bench-out") / args.matrix.stem).resolve()
    try:
        settings = BenchSettings(
            out_dir=out,
            servers=tuple(args.server),
            warmups=args.warmups,
            repeats=args.repeats,
            order=args.order,
            plots=not args.no_plots,
            consistency=args.consistency,
            soak=args.soak,
            load=args.load,
            **({"concurrency": args.concurrency} if args.concurrency is not None else {}),
            **({"jobs": args.jobs} if args.jobs is not None else {}),
            overrides=tuple(args.overrides),
            budget_s=args.budget_s,
            server_warmups=args.server_warmups,
            port=args.port,
            headers=headers,
        )
    except (ValueError, WorkflowError) as exc:
        raise UsageError(str(exc)) from exc
    check_out_unused(out)  # said before the servers are asked; run_matrix checks it again
    for url in args.server:  # one that never answers is unreachable, not a server lost mid-matrix
        _check_reachable(url, headers)
    inside = [path for path in (out / "servers", out / "workflows") if not path.exists()]
    made = check_out_folder(out)  # out and the parents it made (the default bench-out/ too)
    err = Console(stderr=True, soft_wrap=True, markup=False)
    try:
        outcome = run_matrix(matrix, settings, progress=lambda line: err.print(line, highlight=False))
    except (LeanVideoError, KeyboardInterrupt):  # refused or stopped before any run (a bad matrix,
        # LeanVideo not installed, a model of yours under a tiny model's name, a --server gone before its
        # flags were read, Ctrl-C while a server started): what it made goes, so the same --out can be
        # used again (kept once a run was recorded)
        _remove_made(inside, made, out)
        raise
    if args.json:
        print_json(console, outcome.document_path.read_text(encoding="utf-8"))
        return bench_exit_code(outcome, err)
    console.print(outcome.markdown_path.read_text(encoding="utf-8"), markup=False, highlight=False)
    if outcome.plot_error:
        err.print(f"[yellow]warning:[/] {escape(outcome.plot_error)}", markup=True)
    console.print(f"results: {outcome.document_path.parent} ({outcome.seconds:.0f} s)", highlight=False)
    return bench_exit_code(outcome, err)


def _check_reachable(url: str, headers: dict[str, str]) -> None:
    """Raise the client's :class:`ServerError` (exit 4, before any folder is made) when the ``--server``
    ``url`` does not answer ``GET /system_stats`` (``headers`` sent with it), or refuses the websocket:
    a run followed by polling has no node's or step's time, and its start is known within the polling
    interval only, which the table's times cannot carry."""
    with ComfyClient(url, headers=headers) as client:
        try:
            client.get_json("/system_stats")
            close_socket(client.connect_websocket())
        except WebsocketRefused as exc:
            raise ServerError(
                f"--server {url}: {exc}; the bench times each node and step from its events: let the "
                "proxy pass websockets on for /ws (`leanvideo run` works without them)",
                status=exc.status,
            ) from exc
        except ServerError as exc:
            raise type(exc)(f"--server {url}: {exc}") from exc


def _remove_made(inside: list[Path], made: list[Path], out: Path) -> None:
    """Remove the folders the bench made in ``out`` (``inside``: a refused matrix's server state
    folder) unless a run was recorded there, then ``out`` and the parents ``check_out_folder`` made
    (``made``) while they are empty: a file the user put there meanwhile stays."""
    if (out / "runs").exists() or (out / "bench.json").exists():
        return
    for path in inside:
        shutil.rmtree(path, ignore_errors=True)
    remove_empty_folders(made)


def bench_exit_code(outcome: Any, err: Console) -> int:
    """6 when a variant failed (its prompt failed; the report says which and why), 4 when a server
    stopped answering (the report has the runs made before), 7 when --budget-s left nothing measured
    (1 when every variant was skipped for another reason), else 0."""
    for message in outcome.server_lost:
        err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    failed = [result.name for result in outcome.results if result.failed is not None]
    if failed:
        err.print(
            f"[bold red]error:[/] {len(failed)} variant(s) failed: {escape(', '.join(failed))}", markup=True
        )
        return PromptFailedError.exit_code
    if outcome.server_lost:
        return ServerError.exit_code
    if outcome.results and all(result.total is None for result in outcome.results):
        reasons = "; ".join(f"{r.name}: {r.skipped}" for r in outcome.results)
        err.print(f"[bold red]error:[/] nothing was measured ({escape(reasons)})", markup=True)
        budget = any("--budget-s" in (r.skipped or "") for r in outcome.results)
        return PromptTimeoutError.exit_code if budget else 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runner.cli.bench MATRIX.toml …``: the ``bench`` command on its own."""
    parser = argparse.ArgumentParser(prog="leanvideo")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    console = PipeConsole(soft_wrap=True, markup=False)
    err = Console(stderr=True, soft_wrap=True, markup=False)  # a path in an error stays on one line
    try:
        with stop_signals():  # SIGTERM, and SIGINT also when started in the background (inherited ignored)
            return run_bench(args, console)
    except BrokenPipeError:  # `| head` went away
        return broken_pipe_exit()
    except LeanVideoError as exc:
        err.print(f"{failure_label(exc)} {escape(str(exc))}", highlight=False, markup=True)
        if args.json:
            print_json_error(console, error_type(exc), str(exc), exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        if args.json:
            print_json_error(console, "KeyboardInterrupt", "interrupted", INTERRUPTED)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
