"""The batch database's disk fills mid-batch: `batch submit --wait` stops with one error naming the
database (it printed DBOS's tracebacks for ever and never ended), and the same command run again once
there is space finishes every job exactly once. The end-to-end test puts the database on a 4 MiB tmpfs
(root only) over a real pinned server; the recognition of DBOS's records is tested everywhere."""

from __future__ import annotations

import errno
import logging
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.batch_bench import write_jobs
from runner.batch.database_full import DatabaseFullWatch, DatabaseOutageQuiet, full_disk_message
from runner.local.server import ComfyServer
from tests.batch_helpers import assert_exactly_once, jobs_of, run_batch, start_batch, wait_until


def _record(message: str, error: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(error), error, None) if error is not None else None
    return logging.LogRecord("dbos", logging.ERROR, __file__, 1, message, None, exc_info)


def _sqlite_full_in_a_step() -> BaseException:
    """What DBOS logs: its own error, caused by SQLAlchemy's, caused by sqlite3's."""
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as cause:
            raise RuntimeError(
                "(sqlite3.OperationalError) database or disk is full\n[SQL: UPDATE …]"
            ) from cause
    except RuntimeError as wrapped:
        try:
            raise ValueError("Exception encountered in background workflow") from wrapped
        except ValueError as outer:
            return outer


def test_the_records_of_a_full_database_disk_are_recognised_kept_once_and_dropped() -> None:
    watch = DatabaseFullWatch()
    step = _record("Exception encountered in background workflow:", _sqlite_full_in_a_step())
    assert full_disk_message(step) == "RuntimeError: (sqlite3.OperationalError) database or disk is full"
    queue_thread = _record(
        "Exception encountered in queue thread: (sqlite3.OperationalError) database or disk is full"
    )
    postgres = _record("step failed", OSError(errno.ENOSPC, "could not extend file: No space left on device"))
    others = [
        _record("Exception encountered in background workflow:", RuntimeError("the server went away")),
        _record("workflow abc is no longer owned by this execution"),
    ]
    assert all(full_disk_message(r) is None for r in others)
    assert full_disk_message(postgres) is not None
    assert watch.failure is None and all(watch.filter(r) for r in others)
    assert [watch.filter(r) for r in (step, queue_thread, postgres)] == [False, False, False]
    assert watch.failure == "RuntimeError: (sqlite3.OperationalError) database or disk is full"  # the first


def test_a_database_that_does_not_answer_is_said_once_a_minute_not_per_retry(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL stopped for 30 s mid-batch: DBOS's threads logged every retry with its traceback
    (3,800 lines, 58 tracebacks); nothing was lost. Now one line says it, at most once a minute."""
    from runner.batch import database_full

    said = logging.getLogger("test.outage")
    quiet = DatabaseOutageQuiet(said, "postgresql://lv:***@127.0.0.1:5544/q")
    refused = RuntimeError(
        '(psycopg.OperationalError) connection failed: connection to server at "127.0.0.1", port 5544 '
        "failed: Connection refused"
    )
    outage = [
        _record("Exception encountered in queue thread: " + str(refused)),
        _record("Exception encountered in background workflow:", refused),
        _record("step failed", RuntimeError("FATAL: terminating connection due to administrator command")),
    ]
    others = [
        _record("workflow abc is no longer owned by this execution"),
        _record("step failed", ValueError()),
    ]
    clock = [1000.0]
    monkeypatch.setattr(database_full.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        assert [quiet.filter(r) for r in outage * 20] == [False] * 60
        assert all(quiet.filter(r) for r in others)
        clock[0] += 61
        assert not quiet.filter(outage[0])
        quiet.check_answers_again()  # records came a moment ago: still out
        assert quiet.out  # a worker stopped now says its running jobs cannot be recorded yet
        clock[0] += 31
        assert not quiet.out
        quiet.check_answers_again()  # none for 30 s: it answers again, said once
        quiet.check_answers_again()
        # a host that takes connections and says nothing: psycopg's timeout, with its traceback
        silent = RuntimeError("(psycopg.errors.ConnectionTimeout) connection timeout expired")
        assert not quiet.filter(_record("Exception listing queues:", silent))
    lines = [r.getMessage() for r in caplog.records if r.name == "test.outage"]
    assert len(lines) == 4 and quiet.dropped == 62
    assert lines[0].startswith("the batch database postgresql://lv:***@127.0.0.1:5544/q does not answer (")
    assert "Connection refused" in lines[0] and "retrying" in lines[0]
    assert lines[2] == (
        "the batch database postgresql://lv:***@127.0.0.1:5544/q answers again (it did not for at least "
        "61 s); jobs are recorded"
    )
    assert "connection timeout expired" in lines[3]  # a new outage is said at once


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted at the end."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="mounts a tmpfs")
def test_a_full_database_disk_stops_the_batch_with_one_error_and_a_rerun_finishes_it(
    comfy_server: ComfyServer, small_disk: Path, tmp_path: Path
) -> None:
    db_url, out = f"sqlite:///{small_disk / 'queue.sqlite'}", tmp_path / "out"
    jobs_file = write_jobs(tmp_path / "full.jsonl", 4, steps=16, first_seed=9100)
    argv = [
        "submit",
        str(jobs_file),
        "--db",
        db_url,
        "--out",
        str(out),
        "--wait",
        "--server",
        comfy_server.url,
    ]
    log = tmp_path / "first.log"
    first = start_batch(*argv, log=log)
    try:
        wait_until(lambda: any(j.state == "running" for j in jobs_of(db_url, "full")), 120, "a running job")
        filler = _fill(small_disk)
        assert first.wait(timeout=90) == 1
    finally:
        if first.poll() is None:
            first.kill()
    said = log.read_text(encoding="utf-8", errors="replace")
    assert f"the batch database {db_url} can no longer be written" in said, said[-3000:]
    assert "database or disk is full" in said and "run the same command again" in said
    assert "Traceback" not in said and len(said.splitlines()) < 40, said[-3000:]

    filler.unlink()
    again = run_batch(*argv, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert_exactly_once(jobs_of(db_url, "full"), out, 4)


def test_a_worker_stopped_while_the_database_does_not_answer_waits_for_it_to_hand_its_jobs_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopped during a PostgreSQL outage, a worker logged "could not hand its unfinished jobs back" with
    a traceback, exited 0, and its jobs stayed `running` under its id until it was started again."""
    from contextlib import contextmanager

    from runner.batch import worker as worker_module
    from runner.batch.pool import ServerPool
    from runner.errors import LeanVideoError

    worker = worker_module.BatchWorker(
        "postgresql://lv:secret@127.0.0.1:1/q", ServerPool(["http://127.0.0.1:9"]), worker_id="m1"
    )
    answers_after = [3]

    @contextmanager
    def open_client(url: str) -> Iterator[str]:
        answers_after[0] -= 1
        if answers_after[0] > 0:
            raise LeanVideoError("cannot open the batch database postgresql://lv:***@127.0.0.1:1/q: refused")
        yield "client"

    monkeypatch.setattr(worker_module, "open_client", open_client)
    monkeypatch.setattr(worker_module, "hand_back_jobs", lambda client, worker_id: ["j1", "j2"])
    monkeypatch.setattr(worker_module, "HAND_BACK_RETRY_S", 0.01)
    with caplog.at_level(logging.WARNING, logger="runner.batch.worker"):
        assert worker._hand_back() == 2 and not worker.stranded  # the third try: the database is back
        waited = [r.getMessage() for r in caplog.records]
        assert len(waited) == 1 and "the batch database does not answer (cannot open" in waited[0]
        assert "waiting up to 120 s to put its unfinished jobs back" in waited[0]
        caplog.clear()
        answers_after[0] = 10**6  # it does not come back: given up, said in one line, no traceback
        monkeypatch.setattr(worker_module, "HAND_BACK_DB_WAIT_S", 0.05)
        assert worker._hand_back() == 0 and worker.stranded
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.exc_info is None
    assert (
        "they wait for a worker with its id; run the same command again (or batch worker --worker-id m1)"
        in (error.getMessage())
    )

    def interrupted(seconds: float) -> None:  # Ctrl-C while it waits: it stops waiting
        raise KeyboardInterrupt

    caplog.clear()
    worker.stranded = False
    monkeypatch.setattr(worker_module, "HAND_BACK_DB_WAIT_S", 60.0)
    monkeypatch.setattr(worker_module.time, "sleep", interrupted)
    with caplog.at_level(logging.WARNING, logger="runner.batch.worker"):
        assert worker._hand_back() == 0 and worker.stranded
    assert "could not put its unfinished jobs back on the queue (stopped while waiting)" in caplog.text
