"""The batch queue on SQLite: submitting twice queues nothing twice, cancel and retry, and a job whose
node fails is failed once (not retried) with its node id and message, then run again by
``retry --failed``. The node error comes from the scripted fake server: a real one cannot be made to
fail a node on demand."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
from dbos import DBOSClient

from runner.batch.jobs_file import PreparedJob
from runner.batch.pool import ServerPool
from runner.batch.queue import (
    FINAL_STATES,
    BatchSettings,
    cancel_batch,
    list_jobs,
    open_client,
    retry_batch,
    submit_batch,
)
from runner.batch.worker import BatchWorker
from runner.errors import WorkflowError
from tests.fake_server import VIDEO_BYTES, WORKFLOW, FakeComfy, now_ms


def prepared(job_id: str, seed: int = 1) -> PreparedJob:
    prompt = copy.deepcopy(WORKFLOW)
    prompt["2"]["inputs"]["seed"] = seed
    return PreparedJob(1, job_id, Path("wf.json"), (f"2.seed={seed}",), prompt=prompt)


def test_a_batch_is_queued_once_cancelled_and_requeued(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    settings = BatchSettings(out_dir=tmp_path / "out")
    with open_client(db_url) as client:
        assert submit_batch(client, "b", [prepared("a"), prepared("b", 2)], settings) == 2
        assert submit_batch(client, "b", [prepared("a"), prepared("b", 2)], settings) == 0
        with pytest.raises(WorkflowError, match="already exists with other jobs under the ids b"):
            submit_batch(client, "b", [prepared("a"), prepared("b", 3)], settings)
        assert [(j.job_id, j.state) for j in list_jobs(client, "b")] == [("a", "queued"), ("b", "queued")]
        assert cancel_batch(client, "b") == 2
        assert {j.state for j in list_jobs(client, "b")} == {"cancelled"}
        assert sorted(retry_batch(client, "b")) == ["a", "b"]
        assert {j.state for j in list_jobs(client, "b")} == {"queued"}


def test_a_node_error_fails_the_job_once_with_the_node_and_retry_failed_runs_it_again(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
        if sum(1 for call in fake.calls if call[0] == "POST /prompt") == 1:  # the first run fails in node 2
            error = {"node_id": "2", "node_type": "KSampler", "exception_type": "RuntimeError"}
            data = {"prompt_id": pid, **error, "exception_message": "boom", "timestamp": now_ms()}
            await fake.send({"type": "execution_error", "data": data})
            fake.finish(pid, status="error", outputs={})
        else:
            fake.finish(pid)
        await fake.send({"type": "executing", "data": {"prompt_id": pid, "node": None}})

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    out = tmp_path / "out"
    with FakeComfy(script) as fake, open_client(db_url) as client:
        pool = ServerPool([fake.url], per_server=1)
        with BatchWorker(db_url, pool, grace=30):
            submit_batch(client, "f", [prepared("only")], BatchSettings(out_dir=out, max_attempts=3))
            wait_for_final(client, "f")
            (job,) = list_jobs(client, "f")
            assert job.state == "failed" and job.record is not None
            assert job.record["attempts"] == 1 and job.record["fault"] == "workflow"
            assert job.record["error"] == {"node_id": "2", "class_type": "KSampler", "message": "boom"}
            assert not (out / "only").exists()

            assert retry_batch(client, "f", failed=True) == ["only"]
            wait_for_final(client, "f")
        (job,) = list_jobs(client, "f")
        posted = [call for call in fake.calls if call[0] == "POST /prompt"]
    assert job.state == "success" and job.workflow_id == "f/only/retry-1"
    assert len(posted) == 2  # the failure was not retried on its own; `retry --failed` ran it once more
    assert (out / "only" / "clip_00001_.mp4").read_bytes() == VIDEO_BYTES


def wait_for_final(client: DBOSClient, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(j.state in FINAL_STATES for j in list_jobs(client, name)):
        assert time.monotonic() < deadline, [(j.job_id, j.state) for j in list_jobs(client, name)]
        time.sleep(0.1)
