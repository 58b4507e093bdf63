"""Two `leanvideo batch worker` processes share one throwaway Postgres queue: every job runs once,
and both workers take some. Each worker drives two real pinned servers, as the issue sets it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.batch_bench import write_jobs
from runner.batch.queue import FINAL_STATES
from runner.local.ports import pick_free_port
from runner.local.server import ComfyServer
from tests.batch_helpers import (
    assert_exactly_once,
    history_ids,
    jobs_of,
    run_batch,
    start_batch,
    wait_until,
)
from tests.postgres import throwaway_postgres

pytestmark = pytest.mark.integration


JOBS = 8


@contextmanager
def _two_more_servers(like: ComfyServer, tmp_path: Path) -> Iterator[list[ComfyServer]]:
    """Two more servers configured as ``like`` (own state folder and port), stopped afterwards."""
    with ExitStack() as stack:
        servers = []
        for n in (3, 4):
            config = replace(like.config, state_dir=tmp_path / f"server-{n}", port=pick_free_port())
            servers.append(stack.enter_context(ComfyServer(config)))
        yield servers


def test_two_workers_with_two_servers_each_on_one_postgres_queue_split_the_jobs_with_no_duplicates(
    comfy_server: ComfyServer, second_comfy_server: ComfyServer, tmp_path: Path
) -> None:
    with _two_more_servers(comfy_server, tmp_path) as (third, fourth):
        fleets = [[comfy_server.url, third.url], [second_comfy_server.url, fourth.url]]
        _run_two_workers(fleets, tmp_path)


def _run_two_workers(fleets: list[list[str]], tmp_path: Path) -> None:
    servers = [url for fleet in fleets for url in fleet]
    before = {url: history_ids(url) for url in servers}
    out = tmp_path / "out"
    with throwaway_postgres() as db_url:
        logs = [tmp_path / f"worker-{n}.log" for n in (1, 2)]
        workers = [
            start_batch(
                "worker",
                *[arg for url in fleet for arg in ("--server", url)],
                "--db",
                db_url,
                "--worker-id",
                f"w{n}",
                log=log,
            )
            for n, (fleet, log) in enumerate(zip(fleets, logs, strict=True), start=1)
        ]
        try:
            jobs_file = write_jobs(tmp_path / "shared.jsonl", JOBS, first_seed=12000)
            submit = ["submit", str(jobs_file), "--db", db_url, "--out", str(out)]
            submitted = run_batch(*submit, "--server", servers[0], "--server", servers[1])
            assert submitted.returncode == 0, submitted.stderr
            assert f"{JOBS} newly queued" in submitted.stderr

            def all_finished() -> bool:
                for worker, log in zip(workers, logs, strict=True):
                    assert worker.poll() is None, log.read_text(encoding="utf-8")[-3000:]
                return all(job.state in FINAL_STATES for job in jobs_of(db_url, "shared"))

            wait_until(all_finished, 300, f"the {JOBS} jobs")
            for worker in workers:
                os.killpg(worker.pid, signal.SIGINT)  # Ctrl-C: finish running jobs (none) and stop
            assert [worker.wait(timeout=60) for worker in workers] == [0, 0]
            for log in logs:  # each says it ended, and that nothing went back (every job had ended)
                assert log.read_text(encoding="utf-8").rstrip().endswith("stopped"), log.read_text()[-2000:]
            jobs = jobs_of(db_url, "shared")
        finally:
            for worker in workers:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait(timeout=30)
    records = assert_exactly_once(jobs, out, JOBS)
    by_worker = {name: [r for r in records if r["worker"] == name] for name in ("w1", "w2")}
    assert all(by_worker.values()), {k: len(v) for k, v in by_worker.items()}  # both took jobs
    for n, fleet in enumerate(fleets, start=1):
        ran_here = set().union(*(history_ids(url) - before[url] for url in fleet))
        assert ran_here == {r["prompt_id"] for r in by_worker[f"w{n}"]}  # each job ran once, on its worker
    per_server = {url: len(history_ids(url) - before[url]) for url in servers}
    print({name: len(done) for name, done in by_worker.items()}, per_server)
