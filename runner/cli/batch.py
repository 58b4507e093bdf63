"""``leanvideo batch``: submit a jobs file to the durable queue, run workers, read and steer batches.

Parses arguments, calls :mod:`runner.batch` and renders with rich; nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import time
from pathlib import Path
from types import FrameType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runner.batch.database_url import redact_db_url, resolve_db_url, sqlite_file
from runner.batch.jobs_file import load_batch
from runner.batch.pool import ServerPool
from runner.batch.queue import (
    BatchSettings,
    JobState,
    NoSuchBatchError,
    batch_jobs,
    cancel_batch,
    check_batch_name,
    list_jobs,
    open_client,
    retry_batch,
    submit_batch,
)
from runner.batch.results import BatchSummary, job_row, summarize, write_manifest
from runner.batch.worker import BatchWorker
from runner.batch.worker_ids import default_worker_id
from runner.cli.render import print_json
from runner.cli.server_options import request_headers
from runner.errors import LeanVideoError, PromptTimeoutError, UsageError
from runner.local.workspace import default_workspace_root

PLAIN_EVERY_S = 60.0  # off a terminal, a progress line at least this often
REFRESH_S = 0.5
EXIT_SOME_FAILED = 6  # as a failed prompt


def run_batch_command(args: argparse.Namespace, console: Console, err: Console) -> int:
    db_url = resolve_db_url(args.db, default_workspace_root())
    verb = args.batch_command
    if verb == "submit":
        return _submit(args, db_url, console, err)
    if verb == "worker":
        return _worker(args, db_url, err)
    name = check_batch_name(args.name)
    database = sqlite_file(db_url)
    if database is not None and not database.exists():  # not made by a verb that only reads
        raise LeanVideoError(f"no batch named {name!r}: there is no batch database at {database} yet")
    try:
        return _read_verb(args, verb, name, db_url, console, err)
    except NoSuchBatchError as exc:  # which database: a Postgres one is not said anywhere else
        raise NoSuchBatchError(exc.name, redact_db_url(db_url)) from None


def _read_verb(
    args: argparse.Namespace, verb: str, name: str, db_url: str, console: Console, err: Console
) -> int:
    """``status``, ``results``, ``cancel`` or ``retry`` of the batch ``name``."""
    with open_client(db_url) as client:
        if verb == "status":
            jobs = batch_jobs(client, name)
            if args.json:
                print_json(console, [job_row(job) for job in jobs])
            else:
                console.print(_progress_view(name, jobs, None, None))
            return 0
        if verb == "results":
            jobs = batch_jobs(client, name)
            json_path, csv_path = write_manifest(jobs, _manifest_dir(args.out, name), name)
            if args.json:
                print_json(console, json_path.read_text(encoding="utf-8"))
            (err if args.json else console).print(f"manifest: {json_path} and {csv_path}", highlight=False)
            return 0
        if verb == "cancel":
            left: list[dict[str, str]] = []
            cancelled = cancel_batch(client, name, headers=request_headers(args), left=left)
            if args.json:
                print_json(console, {"batch": name, "cancelled": cancelled, "left_on_servers": left})
            else:
                console.print(f"cancelled {cancelled} job(s) of batch {name}")
            if left:  # a dead worker's prompts still on their servers: said, and found by the next cancel
                where = ", ".join(f"{p['prompt_id']} on {p['server']} (job {p['job_id']})" for p in left)
                err.print(
                    f"error: {len(left)} prompt(s) a stopped worker left could not be taken off their "
                    f"servers, and may run on: {where}; `leanvideo batch cancel {name}` again (with the "
                    "server's --token or --header, when it wants one) takes them off",
                    markup=False,
                    highlight=False,
                )
                return 4
            return 0
        requeued = retry_batch(client, name, failed=args.failed)
        if args.json:
            print_json(console, {"batch": name, "requeued": requeued})
        elif requeued:
            console.print(f"requeued {len(requeued)} job(s): {', '.join(requeued)}", highlight=False)
        else:
            failed = sum(job.state == "failed" for job in batch_jobs(client, name))
            wanted = "cancelled, errored or failed" if args.failed else "cancelled or errored"
            hint = f" ({failed} failed: add --failed to run them again)" if failed and not args.failed else ""
            console.print(f"nothing to requeue: batch {name} has no {wanted} jobs{hint}", highlight=False)
        return 0


def _submit(args: argparse.Namespace, db_url: str, console: Console, err: Console) -> int:
    if args.name is not None:  # an empty --name (an unset $NAME in a script) is refused, not defaulted
        name = check_batch_name(args.name)
    else:
        derived = args.jobs.stem.split(".")[0]
        name = check_batch_name(derived, where="batch name (the jobs file's name; give --name)")
    headers = request_headers(args)  # in this process only: never in a job, a record or the database
    try:
        settings = BatchSettings(
            out_dir=(args.out or Path("leanvideo-out") / f"batch-{name}").resolve(),
            max_attempts=args.max_attempts,
            timeout=args.timeout,
            health_timeout=args.health_timeout,
        )
        pool = ServerPool(args.servers, per_server=args.per_server, headers=headers)
    except ValueError as exc:
        raise LeanVideoError(str(exc)) from exc
    # every line checked before anything is queued; a server silent for --health-timeout is passed over
    jobs = load_batch(args.jobs.resolve(), args.servers, timeout=args.health_timeout, headers=headers)
    with open_client(db_url) as client:
        queued = submit_batch(client, name, jobs, settings, add=args.add)
        err.print(
            f"batch {name}: {len(jobs)} job(s), {queued} newly queued ({redact_db_url(db_url)})",
            highlight=False,
        )
        if not args.wait and args.json:
            print_json(console, {"batch": name, "jobs": len(jobs), "newly_queued": queued})
            return 0
        if not args.wait:
            if queued or any(job.state in ("queued", "running") for job in list_jobs(client, name)):
                next_step = "run it with: leanvideo batch worker --server URL … (or submit again with --wait)"
            else:
                next_step = f"nothing to run: every job of batch {name} has ended (batch status {name})"
            console.print(next_step, highlight=False)
            return 0
        _stop_on_signals()
        began, first_done, said, interrupted = time.monotonic(), None, ("", 0.0), False
        try:
            with (
                BatchWorker(
                    db_url,
                    pool,
                    worker_id=args.worker_id or default_worker_id(args.servers, batch=name),
                    grace=args.grace,
                ) as worker,
                Live(console=err, refresh_per_second=4, transient=False) as live,
            ):
                try:
                    while True:
                        worker.check_database()
                        worker.check_servers()
                        states = list_jobs(client, name)
                        summary = summarize(states)
                        first_done = first_done if first_done is not None else summary.finished
                        live.update(_progress_view(name, states, pool, (began, first_done)))
                        if not err.is_terminal:  # a CI log sees the live view only at the end: say it now
                            said = _say_progress(err, name, summary, worker.running_jobs(name), said)
                        if summary.all_done:
                            break
                        time.sleep(REFRESH_S)
                except KeyboardInterrupt:  # said before the worker's stop waits for running jobs
                    interrupted = True
                    live.stop()
                    if not err.is_terminal:  # rich ends a non-terminal Live's last frame without a newline
                        err.line()
                    _say_stopping(err, worker, args.grace)
                    raise
        except KeyboardInterrupt:  # once the running jobs had their grace: where the batch stands (in
            # words on stderr under --json: stdout's one document is then the interruption's error)
            _say_ended(err if args.json else console, name, list_jobs(client, name), settings.out_dir, False)
            raise
        finally:
            if not err.is_terminal and not interrupted:
                err.line()
        return _say_ended(console, name, states, settings.out_dir, args.json)


def _say_ended(console: Console, name: str, states: list[JobState], out_dir: Path, as_json: bool) -> int:
    """The last line (or JSON document) of ``submit --wait``: how the batch's jobs ended; its exit code."""
    summary = summarize(states)
    counts = summary.counts
    others = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if state != "success" and n)
    if as_json:
        print_json(console, {"batch": name, "jobs": summary.total, "counts": counts, "out": str(out_dir)})
    else:
        console.print(
            f"batch {name}: {counts['success']} succeeded, {summary.total - counts['success']} did not"
            f"{f' ({others})' if others else ''}; job folders in {out_dir}; manifest: leanvideo "
            f"batch results {name} --out DIR",
            highlight=False,
        )
    if counts["success"] == summary.total:
        return 0
    faults = {(state.record or {}).get("fault") for state in states if state.state != "success"}
    return PromptTimeoutError.exit_code if faults == {"timeout"} else EXIT_SOME_FAILED


def _worker(args: argparse.Namespace, db_url: str, err: Console) -> int:
    try:  # the headers stay in this process: a job runs with the headers of the worker that takes it
        pool = ServerPool(args.servers, per_server=args.per_server, headers=request_headers(args))
    except ValueError as exc:
        raise LeanVideoError(str(exc)) from exc
    _stop_on_signals()
    with open_client(db_url):  # creates the database on first use
        pass
    with contextlib.ExitStack() as stack:
        try:
            worker = stack.enter_context(
                BatchWorker(db_url, pool, worker_id=args.worker_id, grace=args.grace)
            )
        except KeyboardInterrupt:  # while it waited for one of its servers: no job taken, a clean stop
            err.print("stopped before taking any job (none of its servers had answered)", highlight=False)
            return 0
        err.print(
            f"{_now()} worker {worker.worker_id}: up to {pool.slots} job(s) at once on "
            f"{', '.join(pool.urls)} ({redact_db_url(db_url)}); Ctrl-C finishes running jobs and stops",
            highlight=False,
        )
        try:
            while True:
                worker.check_database()
                worker.check_servers()
                time.sleep(REFRESH_S)
        except KeyboardInterrupt:
            _say_stopping(err, worker, args.grace)
    if worker.stranded:  # said why; the jobs wait for this worker id, held by no one now
        err.print(
            f"{_now()} stopped; its unfinished jobs wait for worker {worker.worker_id}", highlight=False
        )
        return 1
    if worker.handed_back:
        err.print(
            f"{_now()} stopped: {worker.handed_back} unfinished job(s) went back on the queue",
            highlight=False,
        )
    else:
        err.print(f"{_now()} stopped", highlight=False)
    return 0


def _say_stopping(err: Console, worker: BatchWorker, grace: int) -> None:
    """What a stop waits for: the jobs whose prompts are on servers, up to ``grace`` seconds; jobs not
    finished then go back on the queue."""
    running = worker.running_jobs()
    if running and grace > 0:
        wait = f"{running} running job(s) get up to {grace} s to finish"
    elif running:
        wait = f"{running} running job(s) are taken off their servers (--grace 0)"
    else:
        wait = "no job is running on a server"
    again = "; Ctrl-C again stops now" if running and grace > 0 else ""
    if running and grace > 0 and worker.database_out:  # they cannot end before it answers
        again = "; the batch database does not answer, so they cannot be recorded before it does" + again
    err.print(
        f"{_now()} stopping: {wait}; jobs not finished then go back on the queue for the next worker{again}",
        highlight=False,
    )


def _progress_view(
    name: str, jobs: list[JobState], pool: ServerPool | None, clock: tuple[float, int] | None
) -> Group:
    summary = summarize(jobs)
    counts = summary.counts
    line = (
        f"batch {name}: {summary.finished}/{summary.total} done · {counts['success']} ok · "
        f"{counts['failed'] + counts['error']} failed · "
        + (f"{counts['cancelled']} cancelled · " if counts["cancelled"] else "")
        + f"{counts['running']} running · {counts['queued']} queued"
    )
    if clock is not None:
        began, done_at_start = clock
        elapsed = time.monotonic() - began
        finished_here = summary.finished - done_at_start
        remaining = summary.total - summary.finished
        if finished_here > 0 and remaining > 0:
            line += f" · ETA {remaining * elapsed / finished_here:.0f} s"
        line += f" · {elapsed:.0f} s"
    table = Table(box=None, pad_edge=False)
    live = pool is not None  # `batch status` has no pool: no health or running count to show
    for column in ("server", "health", "running", "ok", "failed") if live else ("server", "ok", "failed"):
        table.add_column(column, justify="left" if column in ("server", "health") else "right")
    health = {s.url: s for s in pool.snapshot()} if pool is not None else {}
    for url in sorted(set(summary.per_server) | set(health)):
        done = summary.per_server.get(url)
        snap = health.get(url)
        state = "—" if snap is None else {True: "up", None: "not probed"}.get(snap.healthy, "out")
        if snap is not None and snap.healthy is False and snap.retry_in_s is not None:
            state += f" (probe in {snap.retry_in_s:.0f} s)"
        seen = [state, str(snap.running) if snap is not None else "—"] if live else []
        table.add_row(url, *seen, str(done["success"] if done else 0), str(done["failed"] if done else 0))
    if counts["error"]:  # a job that raised left no result record, so no server is charged with it
        unknown = ["—", "—"] if live else []
        table.add_row("no server (the job raised)", *unknown, "0", str(counts["error"]))
    # `batch status` knows servers from finished jobs' records: none yet is said, not a bare header
    parts = [Text(line), table if table.row_count else Text("no job has finished on a server yet")]
    holders = sorted({job.worker for job in jobs if job.state == "running" and job.worker})
    if pool is None and holders:  # `batch status`: whose running jobs they are, to resume a stopped one
        parts.append(
            Text(
                f"running jobs are held by worker {', '.join(holders)} (if it died, they wait for a worker "
                "with its --worker-id to start; one that stops puts them back on the queue)"
            )
        )
    return Group(*parts)


def _manifest_dir(out: Path, name: str) -> Path:
    """``out``, checked: a folder (made when missing) whose manifest, if any, is this batch's."""
    folder = out.resolve()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {out}: a file, not a folder")
    present = [m for m in (folder / "results.json", folder / "results.csv") if m.exists()]
    if present and not _is_manifest_of(folder / "results.json", name):
        raise UsageError(
            f"--out {out}: {present[0]} is there and is not the manifest of batch {name!r}; nothing was "
            "written (choose another --out)"
        )
    return folder


def _say_progress(
    err: Console, name: str, summary: BatchSummary, on_servers: int, said: tuple[str, float]
) -> tuple[str, float]:
    """A plain progress line when the counts changed, or :data:`PLAIN_EVERY_S` after the last one;
    returns what was said last and when. ``on_servers``: the batch's jobs on this worker's servers
    (another batch's may share them)."""
    counts = summary.counts
    on_servers = min(on_servers, counts["running"])  # read at another moment than the states
    waiting = counts["running"] - on_servers  # taken from the queue, waiting for a free slot
    line = (
        f"batch {name}: {summary.finished}/{summary.total} finished ({counts['success']} succeeded, "
        f"{counts['failed'] + counts['error']} failed"
        + (f", {counts['cancelled']} cancelled" if counts["cancelled"] else "")
        + f"), {on_servers} running on servers, {counts['queued'] + waiting} waiting"
    )
    now = time.monotonic()
    if line == said[0] and now - said[1] < PLAIN_EVERY_S:
        return said
    err.print(f"{_now()} {line}", highlight=False, markup=False)
    return line, now


def _now() -> str:
    """The time of day a worker's line begins with, as its log lines do (a worker runs for hours)."""
    return time.strftime("%H:%M:%S")


def _is_manifest_of(path: Path, name: str) -> bool:
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("batch") == name)
    except (OSError, ValueError, AttributeError):
        return False


def _stop_on_signals() -> None:
    """SIGTERM and SIGINT both stop the way Ctrl-C does. SIGINT is set explicitly: a process started
    in the background by a shell (``worker … &``, nohup) inherits SIGINT ignored, and ``kill -INT``
    would otherwise do nothing."""

    def _terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
