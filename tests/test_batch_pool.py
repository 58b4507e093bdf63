"""The server pool (K slots per server, least busy first, a failed server out until a probe answers,
with growing waits) and the job folder that is published once and never replaced. A fake probe
stands in for ``GET /system_stats``: the faults are the point."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runner.batch.attempt import RESULT_NAME, _publish, finished_record, occupant_problem
from runner.batch.pool import ServerPool
from runner.errors import ServerError

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


class FakeProbe:
    def __init__(self, answering: set[str]) -> None:
        self.answering = answering
        self.calls: list[tuple[str, float]] = []

    def __call__(self, url: str) -> bool:
        self.calls.append((url, time.monotonic()))
        return url in self.answering


def test_each_server_takes_k_jobs_and_the_least_busy_comes_first() -> None:
    pool = ServerPool([A, B], per_server=2, probe=FakeProbe({A, B}))
    taken = [pool.acquire() for _ in range(4)]
    assert sorted(taken) == [A, A, B, B] and taken[:2] in ([A, B], [B, A])
    stop = threading.Event()
    waiter: list[str] = []
    thread = threading.Thread(target=lambda: waiter.append(pool.acquire(stop)))
    thread.start()
    time.sleep(0.3)
    assert not waiter  # all four slots are busy: the fifth job waits
    pool.release(B)
    thread.join(timeout=5)
    assert waiter == [B]
    assert [(s.url, s.running) for s in pool.snapshot()] == [(A, 2), (B, 2)]


def test_a_failed_server_is_out_until_a_probe_answers_with_growing_waits() -> None:
    probe = FakeProbe({A, B})
    pool = ServerPool([A, B], per_server=1, probe=probe)
    first = pool.acquire()
    pool.release(first, server_failed=True, reason="test")
    other = B if first == A else A
    assert pool.acquire() == other  # the failed one is out
    (out,) = [s for s in pool.snapshot() if s.url == first]
    assert out.healthy is False and out.failures == 1 and out.retry_in_s is not None
    probe.answering.discard(first)
    began = time.monotonic()
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(pool.acquire()))
    thread.start()
    time.sleep(1.5)  # first probe after 1 s fails: next in 2 s
    assert not result
    probe.answering.add(first)
    thread.join(timeout=10)
    assert result == [first]
    probes = [t - began for url, t in probe.calls if url == first and t >= began]
    assert len(probes) == 2 and 0.8 < probes[0] < 1.5 and 2.6 < probes[1] < 3.8, probes


def test_a_waiting_job_gives_up_when_the_worker_stops() -> None:
    pool = ServerPool([A], per_server=1, probe=FakeProbe(set()))
    stop = threading.Event()
    stop.set()
    with pytest.raises(ServerError, match="stopped while waiting"):
        pool.acquire(stop)


def test_the_pool_says_how_long_every_server_has_been_out_with_nothing_on_it() -> None:
    """What a worker stands down on (``BatchWorker.check_servers``): not while one server is in, not
    probed yet, or still holds a job, and counted from the last one to go out."""
    probe = FakeProbe({A, B})
    pool = ServerPool([A, B], per_server=1, probe=probe)
    assert pool.all_out_for() is None  # not probed yet
    a, b = pool.acquire(), pool.acquire()
    probe.answering.clear()
    pool.release(a, server_failed=True, reason="test")
    assert pool.all_out_for() is None  # the other one is in, with a job on it
    time.sleep(0.3)
    pool.release(b, server_failed=True, reason="test")
    out = pool.all_out_for()
    assert out is not None and out < 0.2  # from the last one out, not the first
    time.sleep(0.3)
    assert (pool.all_out_for() or 0) >= 0.3
    probe.answering.add(A)
    assert pool.acquire() == A  # probed back in
    assert pool.all_out_for() is None


def test_bad_pools_are_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        ServerPool([A, A])
    with pytest.raises(ValueError, match="listed twice"):  # one server, by two of this machine's names
        ServerPool(["http://127.0.0.1:8188", "http://LOCALHOST:8188/"])
    with pytest.raises(ValueError, match="per_server"):
        ServerPool([A], per_server=0)


def _finished_run(tmp_path: Path, job: dict[str, str], n: int, **fields: str) -> tuple[Path, dict[str, Any]]:
    """A run's private folder with its video and result.json, as an attempt leaves it."""
    partial = tmp_path / ".partial" / f"{job['job_id']}-{n}"
    partial.mkdir(parents=True)
    (partial / "video.mp4").write_bytes(b"run %d" % n)
    record = {"job_id": job["job_id"], "batch": job["batch"], "digest": job["digest"], "prompt_id": f"p{n}"}
    record |= {"server": A, "worker": "w", "attempt": 1, **fields}
    (partial / RESULT_NAME).write_text(json.dumps(record), encoding="utf-8")
    return partial, record


def test_a_job_folder_is_published_once_and_never_replaced(tmp_path: Path) -> None:
    job = {"out_dir": str(tmp_path), "job_id": "j1", "batch": "b", "digest": "d1"}
    assert finished_record(job) is None and occupant_problem(job) is None
    runs = []
    for n in (1, 2):
        partial, record = _finished_run(tmp_path, job, n)
        runs.append(_publish(job, partial, record))
        assert not partial.exists()
    assert runs[0] == runs[1] and runs[1]["prompt_id"] == "p1"  # the second run got the first's record
    assert (tmp_path / "j1" / "video.mp4").read_bytes() == b"run 1"
    assert finished_record(job) == runs[0] and occupant_problem(job) is None


def test_a_folder_of_another_batch_or_of_the_user_is_never_taken_for_the_jobs(tmp_path: Path) -> None:
    """Two batches with line-number ids in one --out: batch 'tue' job 1 must not take 'mon' job 1's files."""
    mon = {"out_dir": str(tmp_path), "job_id": "1", "batch": "mon", "digest": "m"}
    tue = {**mon, "batch": "tue", "digest": "t"}
    partial, record = _finished_run(tmp_path, mon, 1)
    assert _publish(mon, partial, record) == record
    assert finished_record(tue) is None
    assert "holds the results of another job (batch 'mon'); choose" in str(occupant_problem(tue))
    changed = occupant_problem({**mon, "digest": "changed"})  # same batch and job, another spec
    assert "holds the results of another job (other settings)" in str(changed)
    partial, record = _finished_run(tmp_path, tue, 2, status="success", seconds=4.2)
    record["files"] = [{"name": "video.mp4", "path": str(tmp_path / "1" / "video.mp4"), "bytes": 5}]
    outcome = _publish(tue, partial, record)
    assert (outcome["status"], outcome["fault"]) == ("failed", "output")
    assert f"this run's files are in {partial}" in outcome["error"]["message"]
    # the prompt ran: the record says which, how long, and where its files are (it said 0 s and none)
    assert (outcome["prompt_id"], outcome["seconds"], outcome["batch"]) == ("p2", 4.2, "tue")
    assert [f["path"] for f in outcome["files"]] == [str(partial / "video.mp4")]
    assert json.loads((partial / RESULT_NAME).read_text()) == outcome  # it said success
    assert (partial / "video.mp4").read_bytes() == b"run 2"  # kept, not deleted
    assert (tmp_path / "1" / "video.mp4").read_bytes() == b"run 1"  # mon's, untouched
    mine = tmp_path / "3"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert "holds no result of this job" in str(occupant_problem({**mon, "job_id": "3"}))


def test_only_expected_dbos_tracebacks_are_dropped() -> None:
    """A cancelled job's, always; a job's failure to record after the worker shut DBOS down (--grace ran
    out), only then; anything else is kept."""
    import logging
    import sys

    from runner.batch.job_noise import CancelledJobNoise

    def record(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except BaseException:
            return logging.LogRecord("dbos", logging.ERROR, __file__, 1, "boom", None, sys.exc_info())

    class DBOSAwaitedWorkflowCancelledError(Exception):
        pass

    late = RuntimeError("DBOS Error: System database accessed before DBOS was launched")
    noise = CancelledJobNoise()
    assert not noise.filter(record(DBOSAwaitedWorkflowCancelledError("cancelled")))
    assert noise.filter(record(late)) and noise.filter(record(ValueError("a real fault")))
    noise.shut_down = True
    assert not noise.filter(record(late)) and noise.filter(record(ValueError("a real fault")))
    # said without a traceback while a worker stopped during a database outage
    for said in (
        "Background thread Thread-5 (queue_thread) did not exit within timeout",
        "Error fetching dequeued workflow statuses: DBOS Error: System database accessed before DBOS was "
        "launched",
    ):
        assert not noise.filter(logging.LogRecord("dbos", logging.WARNING, __file__, 1, said, None, None))
    # DBOS's warning for a workflow another execution took over is kept (two machines, one worker id)
    disowned = "Workflow b/slow is no longer owned by this execution. Waiting for the recorded outcome"
    assert noise.filter(logging.LogRecord("dbos", logging.WARNING, __file__, 1, disowned, None, None))
