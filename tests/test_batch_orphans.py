"""A worker killed mid-job leaves its prompt on the server: the job's next attempt takes it off first
(queue delete + interrupt) and removes the dead attempt's folder; another batch's note of the same job id
is left alone, and a finished job's folder carries no note. The server is the scripted fake: a real one
cannot be made to hold a dead client's prompt on demand."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from runner.batch.attempt import PARTIAL_DIR, run_attempt
from runner.batch.jobs_file import PreparedJob
from runner.batch.orphans import NOTE
from runner.batch.queue import BatchSettings, cancel_batch, job_spec, open_client, submit_batch
from tests.fake_server import WORKFLOW, FakeComfy, now_ms


def prepared(job_id: str) -> PreparedJob:
    return PreparedJob(1, job_id, Path("wf.json"), (), prompt=WORKFLOW)


async def finish(fake: FakeComfy, pid: str) -> None:
    await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
    fake.finish(pid)
    await fake.send({"type": "executing", "data": {"prompt_id": pid, "node": None}})


def _left_by_a_dead_worker(out: Path, batch: str, job_id: str, prompt_id: str, server: str) -> Path:
    folder = out / PARTIAL_DIR / f"{job_id}-{prompt_id[:8]}"
    folder.mkdir(parents=True)
    note = {"batch": batch, "job_id": job_id, "prompt_id": prompt_id, "server": server}
    (folder / NOTE).write_text(json.dumps(note), encoding="utf-8")
    return folder


def test_a_dead_workers_prompt_is_taken_off_before_the_job_runs_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with FakeComfy(finish) as fake:
        job = job_spec("b", prepared("a"), BatchSettings(out_dir=out, timeout=30, health_timeout=5))
        orphan = _left_by_a_dead_worker(out, "b", "a", "0rphan00-0000", fake.url)
        fake.running.add("0rphan00-0000")  # still computing on the server
        other_batch = _left_by_a_dead_worker(out, "other", "a", "0ther000-0000", fake.url)
        outcome = run_attempt(job, fake.url, worker="w", attempt=1)
        assert outcome["status"] == "success", outcome
        assert ("POST /queue", {"delete": ["0rphan00-0000"]}) in fake.calls
        assert ("POST /interrupt", {"prompt_id": "0rphan00-0000"}) in fake.calls
        assert not any("0ther000-0000" in json.dumps(call) for call in fake.calls)
    assert not orphan.exists() and (other_batch / NOTE).is_file()
    assert not (out / "a" / NOTE).exists() and (out / "a" / "result.json").is_file()


def test_a_gone_server_does_not_hold_the_job_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with FakeComfy(finish) as fake:
        job = job_spec("b", prepared("a"), BatchSettings(out_dir=out, timeout=30, health_timeout=5))
        orphan = _left_by_a_dead_worker(out, "b", "a", "0rphan00-0000", "http://127.0.0.1:9")
        assert run_attempt(job, fake.url, worker="w", attempt=1)["status"] == "success"
    assert not orphan.exists()


def test_a_prompt_no_longer_on_the_server_is_not_cancelled_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It finished, or the server restarted: nothing to take off, and the log does not claim it was."""
    out = tmp_path / "out"
    with FakeComfy(finish) as fake:
        job = job_spec("b", prepared("a"), BatchSettings(out_dir=out, timeout=30, health_timeout=5))
        _left_by_a_dead_worker(out, "b", "a", "f1n15hed-0000", fake.url)
        with caplog.at_level(logging.WARNING, logger="runner.batch.orphans"):
            assert run_attempt(job, fake.url, worker="w", attempt=1)["status"] == "success"
        assert not any("f1n15hed-0000" in json.dumps(call) for call in fake.calls)
    assert "f1n15hed-0000" in caplog.text and "no longer on the server" in caplog.text


def test_batch_cancel_takes_off_the_prompt_a_dead_worker_left(tmp_path: Path) -> None:
    """A cancelled job gets no further attempt to take its dead worker's prompt off: the cancel does.
    The folder stays (a live worker may still be writing in its own)."""
    out = tmp_path / "out"
    with FakeComfy(finish) as fake, open_client(f"sqlite:///{tmp_path / 'q.sqlite'}") as client:
        submit_batch(client, "b", [prepared("a")], BatchSettings(out_dir=out))
        folder = _left_by_a_dead_worker(out, "b", "a", "0rphan00-0000", fake.url)
        fake.running.add("0rphan00-0000")
        assert cancel_batch(client, "b") == 1
        assert ("POST /queue", {"delete": ["0rphan00-0000"]}) in fake.calls
        assert ("POST /interrupt", {"prompt_id": "0rphan00-0000"}) in fake.calls
        assert folder.is_dir() and not (folder / NOTE).exists()  # taken off: not asked of again
        fake.calls.clear()
        assert cancel_batch(client, "b") == 0 and fake.calls == []


def test_a_prompt_batch_cancel_cannot_take_off_is_said_and_taken_off_by_the_next_cancel(
    tmp_path: Path,
) -> None:
    """Refused by a proxy (no --token), it was 'could not be taken off (the server did not answer)',
    exit 0, and a second cancel found no job to cancel: the prompt ran on, forgotten."""
    from tests.auth_proxy import AuthProxy

    out = tmp_path / "out"
    with (
        FakeComfy(finish) as fake,
        AuthProxy(fake.url, token="t0ken") as proxy,
        open_client(f"sqlite:///{tmp_path / 'q.sqlite'}") as client,
    ):
        submit_batch(client, "b", [prepared("a")], BatchSettings(out_dir=out))
        folder = _left_by_a_dead_worker(out, "b", "a", "0rphan00-0000", proxy.url)
        fake.running.add("0rphan00-0000")
        left: list[dict[str, str]] = []
        assert cancel_batch(client, "b", left=left) == 1
        assert left == [{"job_id": "a", "prompt_id": "0rphan00-0000", "server": proxy.url}]
        assert (folder / NOTE).is_file() and not any(c[0] == "POST /interrupt" for c in fake.calls)
        again: list[dict[str, str]] = []
        token = {"Authorization": "Bearer t0ken"}
        assert cancel_batch(client, "b", headers=token, left=again) == 0 and again == []
        assert ("POST /interrupt", {"prompt_id": "0rphan00-0000"}) in fake.calls
        assert not (folder / NOTE).exists()


def test_the_attempt_a_dead_worker_left_is_counted_and_logged_in_the_jobs_record(tmp_path: Path) -> None:
    """The prompt ran on a GPU, so the record says two attempts: the lost one (fault ``worker``) and
    the one that finished."""
    from runner.batch.pool import ServerPool
    from runner.batch.queue import list_jobs
    from runner.batch.worker import BatchWorker
    from tests.test_batch_queue import wait_for_final

    out, db_url = tmp_path / "out", f"sqlite:///{tmp_path / 'q.sqlite'}"
    with FakeComfy(finish) as fake, open_client(db_url) as client:
        _left_by_a_dead_worker(out, "b", "a", "0rphan00-0000", fake.url)
        fake.running.add("0rphan00-0000")
        with BatchWorker(db_url, ServerPool([fake.url], per_server=1), grace=30):
            submit_batch(client, "b", [prepared("a")], BatchSettings(out_dir=out))
            wait_for_final(client, "b")
        (job,) = list_jobs(client, "b")
    assert job.state == "success" and job.record is not None
    assert job.record["attempts"] == 2 and job.record["attempt"] == 2
    lost, done = job.record["attempt_log"]
    assert lost == {"attempt": 1, "server": fake.url, "status": "lost", "fault": "worker", "seconds": None}
    assert (done["attempt"], done["status"], done["server"]) == (2, "success", fake.url)


def test_a_dead_workers_prompt_comes_off_before_its_job_waits_for_a_server(tmp_path: Path) -> None:
    """A worker restarted after a kill -9: its recovered job took the orphan off only once it had a
    server slot, so a newer job was sent to that server first, queued behind the orphan, and the orphan
    ran to its end. Now the orphan is taken off while every slot is busy, before the job waits."""
    import threading

    from runner.batch.job_runner import JobRunner, LeftForLater
    from runner.batch.pool import ServerPool

    out = tmp_path / "out"
    with FakeComfy(finish) as fake:
        job = job_spec("b", prepared("a"), BatchSettings(out_dir=out, timeout=30, health_timeout=5))
        orphan = _left_by_a_dead_worker(out, "b", "a", "0rphan00-0000", fake.url)
        fake.running.add("0rphan00-0000")
        pool = ServerPool([fake.url], per_server=1, probe=lambda url: True)
        busy = pool.acquire()  # a newer job holds the only slot
        runner = JobRunner(pool, "w")
        ended: list[BaseException] = []

        def attempt() -> None:
            try:
                runner.attempt(dict(job), 1)
            except BaseException as exc:
                ended.append(exc)

        waiting = threading.Thread(target=attempt, daemon=True)
        waiting.start()
        deadline = time.monotonic() + 10
        try:
            while ("POST /interrupt", {"prompt_id": "0rphan00-0000"}) not in fake.calls:
                assert time.monotonic() < deadline, fake.calls
                time.sleep(0.05)
            assert ("POST /queue", {"delete": ["0rphan00-0000"]}) in fake.calls  # the slot still busy
        finally:
            runner.draining.set()  # the worker stops: the waiting job leaves for later
            waiting.join(timeout=10)
            pool.release(busy)
    assert len(ended) == 1 and isinstance(ended[0], LeftForLater)
    assert not orphan.exists()


def test_a_job_cancelled_while_it_waited_for_a_server_is_not_sent_to_it(tmp_path: Path) -> None:
    """`batch cancel` while the job waited for a free slot: it was sent once the slot freed, loading the
    model for nothing, and taken off a second later."""
    out = tmp_path / "out"
    with FakeComfy(finish) as fake:
        job = job_spec("b", prepared("a"), BatchSettings(out_dir=out, timeout=30, health_timeout=5))
        outcome = run_attempt(job, fake.url, worker="w", attempt=1, cancelled=lambda: True)
    assert outcome["fault"] == "cancelled"
    assert outcome["error"]["message"] == "cancelled before it was sent to a server"
    assert not [call for call in fake.calls if call[0] == "POST /prompt"]
    assert not (out / PARTIAL_DIR).exists() or not list((out / PARTIAL_DIR).iterdir())
