"""Two `leanvideo batch worker` processes share one throwaway Postgres queue: every job runs once,
and both workers take some. Each worker drives one real pinned server (the issue's setting is two
each; one each keeps the test within this machine's two cores)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from runner.batch.queue import FINAL_STATES
from runner.local.server import ComfyServer
from tests.batch_helpers import (
    assert_exactly_once,
    history_ids,
    jobs_of,
    run_batch,
    start_batch,
    wait_until,
    write_jobs,
)
from tests.postgres import throwaway_postgres

pytestmark = pytest.mark.integration


def test_two_workers_on_one_postgres_queue_split_the_jobs_with_no_duplicates(
    comfy_server: ComfyServer, second_comfy_server: ComfyServer, tmp_path: Path
) -> None:
    servers = [comfy_server.url, second_comfy_server.url]
    before = {url: history_ids(url) for url in servers}
    out = tmp_path / "out"
    with throwaway_postgres() as db_url:
        logs = [tmp_path / f"worker-{n}.log" for n in (1, 2)]
        workers = [
            start_batch("worker", "--server", url, "--db", db_url, "--worker-id", f"w{n}", log=log)
            for n, (url, log) in enumerate(zip(servers, logs, strict=True), start=1)
        ]
        try:
            jobs_file = write_jobs(tmp_path / "shared.jsonl", 6, first_seed=12000)
            submit = ["submit", str(jobs_file), "--db", db_url, "--out", str(out)]
            submitted = run_batch(*submit, "--server", servers[0], "--server", servers[1])
            assert submitted.returncode == 0, submitted.stderr
            assert "6 newly queued" in submitted.stderr

            def all_finished() -> bool:
                for worker, log in zip(workers, logs, strict=True):
                    assert worker.poll() is None, log.read_text(encoding="utf-8")[-3000:]
                return all(job.state in FINAL_STATES for job in jobs_of(db_url, "shared"))

            wait_until(all_finished, 240, "the six jobs")
            for worker in workers:
                os.killpg(worker.pid, signal.SIGINT)  # Ctrl-C: finish running jobs (none) and stop
            assert [worker.wait(timeout=60) for worker in workers] == [0, 0]
            jobs = jobs_of(db_url, "shared")
        finally:
            for worker in workers:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait(timeout=30)
    records = assert_exactly_once(jobs, out, 6)
    by_worker = {name: [r for r in records if r["worker"] == name] for name in ("w1", "w2")}
    assert all(by_worker.values()), {k: len(v) for k, v in by_worker.items()}  # both took jobs
    for n, url in enumerate(servers, start=1):
        ran_here = history_ids(url) - before[url]
        assert ran_here == {r["prompt_id"] for r in by_worker[f"w{n}"]}  # each job ran once, on its worker
    print({name: len(done) for name, done in by_worker.items()})
