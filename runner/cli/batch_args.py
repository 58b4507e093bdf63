"""``leanvideo batch`` arguments: declared apart from :mod:`runner.cli.batch` so that building the CLI's
parser imports no DBOS (about 0.25 s, and absent from the GPU device kit); the command module is imported
only when ``batch`` runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from runner.cli.server_options import (
    AppendServer,
    add_auth_arguments,
    given_path,
    number_type,
    positive_seconds,
    server_url,
)


def add_batch_parser(sub: Any) -> None:
    batch = sub.add_parser(
        "batch",
        help="run a jobs file (one workflow × many settings) over many ComfyUI servers, durably",
        description="A durable queue of workflow runs (DBOS): SQLite on one machine by default, "
        "Postgres (--db postgresql://… or $LEANVIDEO_DB) for workers on many machines.",
    )
    verbs = batch.add_subparsers(dest="batch_command", required=True, metavar="VERB")

    submit = verbs.add_parser(
        "submit",
        help="check a jobs file and queue it; --wait runs it here",
        epilog="exit codes: 0 queued (with --wait: every job succeeded), 1 the database cannot be used, "
        "2 usage (an --out or option that cannot be used, a worker id in use), 4 the first server is "
        "unreachable, 5 jobs file rejected (nothing queued), 6 some jobs did not succeed, 7 only "
        "timeouts, 130 interrupted",
    )
    submit.add_argument("jobs", type=Path, help="jobs file: JSONL, or CSV with set:NODE.input columns")
    submit.add_argument(
        "--json", action="store_true", help="print what was queued (with --wait: how the jobs ended) as JSON"
    )
    _servers(submit, required=True)
    add_auth_arguments(submit, where=" in front of every --server")
    _db(submit)
    submit.add_argument("--name", help="batch name (default: the jobs file's name without suffix)")
    submit.add_argument(
        "--out", type=given_path, help="where job folders go (default leanvideo-out/batch-NAME)"
    )
    submit.add_argument("--wait", action="store_true", help="run the batch here, with live progress")
    submit.add_argument(
        "--add", action="store_true", help="add the file's new jobs to a batch of that name that exists"
    )
    submit.add_argument(
        "--max-attempts", type=_at_least_one, default=3, help="tries per job on dead servers (3)"
    )
    submit.add_argument("--timeout", type=positive_seconds, default=1800.0, help="seconds per attempt (1800)")
    submit.add_argument(
        "--health-timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds a silent server gets mid-job, and to answer the jobs file's check (30)",
    )
    _worker_options(submit)

    worker = verbs.add_parser(
        "worker",
        help="take jobs from the queue onto these servers until Ctrl-C",
        epilog="exit codes: 0 stopped with Ctrl-C or SIGTERM, 1 the database cannot be used (also when, "
        "stopped while it did not answer, the worker's unfinished jobs could not go back on the queue: "
        "they wait for a worker with its id), 2 usage (also a worker id in use on this machine)",
    )
    _servers(worker, required=True)
    add_auth_arguments(worker, where=" in front of every --server")
    _db(worker)
    _worker_options(worker)

    for verb, text in (
        ("status", "counts and per-server progress"),
        ("cancel", "cancel queued and running jobs"),
    ):
        parser = verbs.add_parser(verb, help=text, epilog=READ_VERB_CODES)
        parser.add_argument("name")
        _db(parser)
        if verb == "cancel":  # it takes a dead worker's prompts off their servers
            add_auth_arguments(parser, where=" in front of the servers the jobs' prompts are on")
        parser.add_argument(
            "--json",
            action="store_true",
            help="print every job as JSON" if verb == "status" else "print the cancelled count as JSON",
        )

    results = verbs.add_parser(
        "results",
        help="write results.csv + results.json for a batch",
        epilog=READ_VERB_CODES.replace("2 usage", "2 usage (also an --out holding files not of this batch)"),
    )
    results.add_argument("name")
    results.add_argument("--out", type=given_path, required=True, help="folder for the manifest")
    results.add_argument("--json", action="store_true", help="also print the manifest rows as JSON")
    _db(results)

    retry = verbs.add_parser(
        "retry", help="requeue cancelled and errored jobs (--failed: failed too)", epilog=READ_VERB_CODES
    )
    retry.add_argument("name")
    retry.add_argument("--failed", action="store_true", help="also run jobs whose result is a failure")
    retry.add_argument("--json", action="store_true", help="print the requeued job ids as JSON")
    _db(retry)


_at_least_one = number_type(int, "whole number", least=1, rule="at least 1")
_whole_seconds = number_type(int, "whole number of seconds", least=0, rule="0 or more seconds")
READ_VERB_CODES = (
    "exit codes: 0 done (for status: the batch shown, whatever state it is in), 1 no batch of that name "
    "(or the database cannot be used), 2 usage"
)


def _servers(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--server",
        dest="servers",
        type=server_url,
        action=AppendServer,
        required=required,
        metavar="URL",
        help="repeatable",
    )


def _db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", help="sqlite:///PATH or postgresql://… (default $LEANVIDEO_DB or the workspace)"
    )


def _worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--per-server", type=_at_least_one, default=1, metavar="K", help="jobs at once per server (1)"
    )
    parser.add_argument(
        "--worker-id",
        help="this worker's id; a worker that starts under a dead one's id runs its unfinished jobs "
        "(default: host name + a digest of its servers, + the batch name for submit --wait)",
    )
    parser.add_argument(
        "--grace",
        type=_whole_seconds,
        default=600,
        help="on Ctrl-C, seconds running jobs get to finish (600)",
    )
