"""``leanvideo`` command line: parses arguments, calls the library, renders with rich.

Exit codes follow :mod:`runner.errors` (0 ok, 1 generic, 2 usage, 3 workspace, 4 server unreachable or
prompt lost, 5 workflow invalid or rejected, 6 prompt failed, 7 prompt timed out, 130 cancelled).
"""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from runner.cli.argv import asks_for_json, command_of
from runner.cli.batch_args import add_batch_parser
from runner.cli.bench import add_bench_parser, run_bench
from runner.cli.demo import add_demo_parser, run_demo_command
from runner.cli.kernels import add_kernels_parser, run_kernels_command
from runner.cli.models import add_models_parser, run_models_command
from runner.cli.quantize import add_quantize_parser, run_quantize
from runner.cli.render import (
    INTERRUPTED,
    PipeConsole,
    broken_pipe_exit,
    error_type,
    failure_label,
    print_json,
    print_json_error,
    run_progress,
    summary_table,
)
from runner.cli.serve import add_serve_parsers, run_serve_command, run_stop_command
from runner.cli.server_options import (
    Parser,
    UsageExit,
    add_server_arguments,
    given_path,
    override_spec,
    positive_seconds,
    run_options,
)
from runner.cli.signals import stop_signals
from runner.cli.workflow import add_workflow_parser, run_workflow_command
from runner.errors import LeanVideoError, UsageError, WorkspaceError
from runner.jobs.run import run_workflow
from runner.local.workspace import REPO_ROOT, find_workspace
from runner.tracking.record import unapplied_loras

EXIT_CODES = (
    "exit codes: 0 ok, 1 other error, 2 usage, 3 not installed, 4 server unreachable or prompt lost "
    "(server restarted), 5 workflow invalid or rejected, 6 prompt failed on the server, 7 timed out, "
    "130 cancelled (Ctrl-C)"
)


# An OSError of these is a path that cannot be used as given (usage, exit 2); others (a full disk) exit 1
UNUSABLE_PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.ENOTDIR})
# The commands whose flags after "--" are ComfyUI's; for the others "--" ends the options, as usual
PASSTHROUGH_COMMANDS = frozenset({"serve", "demo"})
LOG_WIDTH = 200  # off a terminal (a CI log, a file) tables keep whole paths and names, not 80 columns


def _console(*, stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or "COLUMNS" in os.environ else LOG_WIDTH
    # markup=False: paths, titles and values are the user's text, never rich markup ("o[/x]" is a name);
    # the few styled words ask for markup themselves
    return PipeConsole(stderr=stderr, soft_wrap=True, width=width, markup=False)


class _VersionAction(argparse.Action):
    """``--version``: the package's version and, in a git checkout, its commit (a ``git pull`` does not
    change the version an editable install reports)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    try:
        version = importlib.metadata.version("leanvideo")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed as a package)"
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version} (commit {commit})" if commit else version


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leanvideo",
        description="Run video models in ComfyUI on one GPU, measured honestly.",
        epilog="Environment: LEANVIDEO_WORKSPACE (workspace folder), LEANVIDEO_COMFYUI (ComfyUI folder), "
        "LEANVIDEO_SERVER (default --server of run and workflow), LEANVIDEO_TOKEN (default --token), "
        "LEANVIDEO_DB (batch database), LEANVIDEO_INT8_KERNEL (force an INT8 kernel on servers started "
        "here). Every command takes SIGTERM and SIGHUP (unless under nohup) as Ctrl-C; each command's "
        "--help lists its exit codes.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_parsers(sub)

    fixtures = sub.add_parser(
        "fixtures",
        help="write the deterministic tiny random-weight models",
        epilog="exit codes: 0 written or already current, 1 a file could not be written (a full disk: the "
        "file named), 2 DIR unusable or a model of yours under a fixture's name (never written over), 3 not "
        "installed, 130 interrupted (nothing half-written)",
    )
    fixtures.add_argument(
        "dir", nargs="?", type=given_path, help="models folder (default <workspace>/models)"
    )  # "" (an unset variable) is refused: it wrote the models into the current folder
    fixtures.add_argument("--force", action="store_true", help="rewrite files even when they are current")

    add_demo_parser(sub)

    run = sub.add_parser(
        "run",
        help="run a workflow (API or editor file) on a server: progress, timings, outputs, run record",
        description="Submit WORKFLOW to a running ComfyUI, follow it (surviving websocket drops), download "
        "every output into a folder of its own and write run.json beside them.",
        epilog=EXIT_CODES,
    )
    run.add_argument(
        "workflow",
        type=Path,
        help="workflow JSON: API format, or an editor file (converted); a PNG ComfyUI saved (the workflow in "
        "it); - for standard input",
    )
    add_server_arguments(run)
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        type=override_spec,
        default=[],
        metavar="NODE.input=VALUE",
        help="change an input; NODE is a node id, title or unique class (Sample.noise_seed=42, 9.steps=4); "
        "repeatable, and for one input given twice the last wins (the run record lists both)",
    )
    run.add_argument(
        "--out",
        type=given_path,
        default=Path("leanvideo-out"),
        help="parent of the run folders (default: leanvideo-out)",
    )
    run.add_argument(
        "--timeout",
        type=positive_seconds,
        default=1800.0,
        help="seconds for the whole run, retries included; then the prompt is interrupted (default 1800)",
    )
    run.add_argument("--json", action="store_true", help="print the run record as JSON (no progress display)")
    run.add_argument(
        "--no-validate", action="store_true", help="skip the client-side check against /object_info"
    )

    add_workflow_parser(sub)
    add_models_parser(sub)
    add_quantize_parser(sub)
    add_kernels_parser(sub)
    add_bench_parser(sub)
    add_batch_parser(sub)
    return parser


def log_format(args: argparse.Namespace) -> str:
    """How the command's log lines look: with the time of day for a batch worker (or ``submit --wait``),
    which runs for hours (how long a database outage lasted, say), else the level and message."""
    worker = args.command == "batch" and (args.batch_command == "worker" or getattr(args, "wait", False))
    return ("%(asctime)s " if worker else "") + "%(levelname)s %(message)s"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in args_list and command_of(args_list) in PASSTHROUGH_COMMANDS:
        cut = args_list.index("--")
        args_list, passthrough = args_list[:cut], args_list[cut + 1 :]
    try:
        args = build_parser().parse_args(args_list)
    except UsageExit as refused:
        if asks_for_json(args_list):  # scripts reading --json get the error as JSON too
            print(json.dumps({"error": {"type": "UsageError", "message": refused.message, "exit_code": 2}}))
        raise
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format=log_format(args), datefmt="%H:%M:%S"
    )
    for stream in (sys.stdout, sys.stderr):  # a terminal that is not UTF-8: "?" for what it lacks, no crash
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="replace")
    console, err = _console(stderr=False), _console(stderr=True)
    try:
        with stop_signals():  # SIGTERM and a background `kill -INT` take Ctrl-C's path too
            return _dispatch(args, tuple(passthrough), console, err)
    except UsageExit as refused:
        if getattr(args, "json", False):
            print_json_error(console, "UsageError", refused.message, 2)
        raise
    except BrokenPipeError:  # stdout's reader went away (`| head`)
        return broken_pipe_exit()
    except LeanVideoError as exc:
        if isinstance(exc.__cause__, BrokenPipeError):  # the reader of the output went away (`| head`)
            return _said_on_a_broken_pipe(exc, err)
        err.print(f"{failure_label(exc)} {escape(str(exc))}", highlight=False, markup=True)
        if exc.record_path is not None:
            partial = getattr(exc.result, "partial", False)  # a failed prompt's record is whole
            err.print(f"{'partial run' if partial else 'run'} record: {exc.record_path}", highlight=False)
        # scripts reading --json get the error as JSON too (run printed the prompt's record instead)
        if getattr(args, "json", False) and not (args.command == "run" and exc.record_path is not None):
            print_json_error(console, error_type(exc), str(exc), exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (a cancelled prompt is a PromptCancelledError above)
        err.print("interrupted")
        if getattr(args, "json", False):
            print_json_error(console, "KeyboardInterrupt", "interrupted", INTERRUPTED)
        return INTERRUPTED
    except OSError as exc:  # a file or folder the command had to write or read: named, not a traceback
        code = 2 if exc.filename is not None and exc.errno in UNUSABLE_PATH_ERRNOS else 1
        message = os_error_message(exc)
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
        if getattr(args, "json", False):
            print_json_error(console, type(exc).__name__, message, code)
        return code


def _said_on_a_broken_pipe(exc: LeanVideoError, err: Console) -> int:
    """SIGPIPE's exit for a prompt cancelled because its output's reader went away; the error and the
    partial record are said on stderr when stderr is not that same closed pipe (``2>&1 | head``)."""
    try:
        err.print(f"{failure_label(exc)} {escape(str(exc))}", highlight=False, markup=True)
        if exc.record_path is not None:
            err.print(f"partial run record: {exc.record_path}", highlight=False)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())  # no second error at exit
    return broken_pipe_exit()


def os_error_message(exc: OSError) -> str:
    """An OSError said with the path or paths it names (a rename or link names two), else as it is."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    if exc.filename2 is not None:
        return f"{exc.filename} → {exc.filename2}: {reason}"
    return f"{exc.filename}: {reason}"


def _dispatch(args: argparse.Namespace, passthrough: tuple[str, ...], console: Console, err: Console) -> int:
    """Run the command ``args`` names; returns its exit code."""
    commands: dict[str, Callable[[], int]] = {
        "serve": lambda: run_serve_command(args, passthrough, console),
        "stop": lambda: run_stop_command(args, console),
        "fixtures": lambda: cmd_fixtures(args, console),
        "run": lambda: cmd_run(args, console, err),
        "quantize": lambda: run_quantize(args, console),
        "bench": lambda: run_bench(args, console),
        "workflow": lambda: run_workflow_command(args, console),
        "models": lambda: run_models_command(args, console),
        "kernels": lambda: run_kernels_command(args, console),
        "batch": lambda: cmd_batch(args, console, err),
        "demo": lambda: run_demo_command(args, passthrough, console),
    }
    return commands[args.command]()


def cmd_batch(args: argparse.Namespace, console: Console, err: Console) -> int:
    try:
        # Imported here: DBOS costs every other command 0.25 s, and the GPU device kit does not carry it.
        from runner.cli.batch import run_batch_command
    except ImportError as exc:
        err.print(
            f"[bold red]error:[/] leanvideo batch needs DBOS, which does not import here "
            f"({escape(str(exc))}); install it with: pip install 'dbos>=3.4,<4'",
            highlight=False,
            markup=True,
        )
        return WorkspaceError.exit_code
    return run_batch_command(args, console, err)


def cmd_fixtures(args: argparse.Namespace, console: Console) -> int:
    from runner.fixtures import fixture_set, write_fixtures

    ws = find_workspace()
    target = (args.dir or ws.models_dir).resolve()
    for folder in (target, *sorted({path.parent for path in fixture_set(target).paths()})):
        if folder.exists() and not folder.is_dir():  # said, not "File exists" from deep inside
            raise UsageError(f"{folder} is a file, not a folder: move it away, or give another models folder")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{target}: cannot be the models folder ({exc.strerror or exc})") from exc
    written = write_fixtures(target, ws.comfyui_dir, force=args.force, python=ws.python)
    table = Table(title=f"tiny models in {target}")
    table.add_column("file")
    table.add_column("MB", justify="right")
    for path in written.paths():
        table.add_row(str(path.relative_to(target)), f"{path.stat().st_size / 1e6:.1f}")
    console.print(table)
    return 0


def cmd_run(args: argparse.Namespace, console: Console, err: Console) -> int:
    options = run_options(
        args,
        out_dir=args.out.resolve(),
        overrides=tuple(args.overrides),
        timeout=args.timeout,
        validate=not args.no_validate,
    )
    # not resolve(): /dev/stdin, <(…) are read where they are; "-" is standard input
    path = args.workflow if str(args.workflow) == "-" else args.workflow.absolute()
    if args.json:
        try:
            outcome = run_workflow(path, options)
        except LeanVideoError as exc:
            if exc.record_path is not None:  # machines get the partial record as well
                print_json(console, Path(exc.record_path).read_text(encoding="utf-8"))
            raise
        print_json(console, outcome.record)
        return 0
    with run_progress(err) as progress:  # its node count comes with the prompt's first event
        outcome = run_workflow(path, options, on_event=progress.update)
    console.print(summary_table(outcome.record))
    console.print(f"record: {outcome.record_path}", highlight=False)
    for said in unapplied_loras(outcome.record.get("telemetry") or {}):  # said again below the tables
        err.print(f"warning: {said}", markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
