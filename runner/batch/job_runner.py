"""The job workflow's body, bound to one worker's pool: attempts of a job on its servers until one
succeeds, the job faults, or its ``max_attempts`` run out (see :mod:`runner.batch.worker`).

A :class:`JobRunner` is made per start of a :class:`~runner.batch.worker.BatchWorker`; its
``draining`` and ``stop`` events are how a stopping worker tells the jobs it runs.

Example::

    runner = JobRunner(ServerPool(["http://127.0.0.1:8188"], per_server=1), "host-abc")
    register_job_workflow(runner)  # DBOS runs runner.run_job for each job this process takes
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dbos import DBOS

from runner.batch.attempt import PARTIAL_DIR, InFlight, inspect_folder, output_fault, run_attempt
from runner.batch.job_noise import is_cancelled
from runner.batch.orphans import take_off_orphans
from runner.batch.pool import ServerPool
from runner.batch.queue import JOB_WORKFLOW
from runner.errors import ServerError

__all__ = ["LOST_ATTEMPT", "JobRunner", "LeftForLater", "register_job_workflow"]

logger = logging.getLogger(__name__)

# An attempt whose worker died while its prompt was out (found by the next attempt's orphan check)
LOST_ATTEMPT = {"status": "lost", "fault": "worker", "seconds": None}


class LeftForLater(BaseException):
    """Raised out of a job whose worker began stopping before the job took a server. A BaseException on
    purpose: DBOS records only what derives from Exception, so neither the step nor the job is
    recorded; the job stays pending under the worker's id until the stopped worker hands it back to the
    queue (not failed, not errored). Without it, a stop with every server out waited the whole
    ``--grace`` for jobs that could never start."""


class JobRunner:
    """What a job workflow does, bound to this process's pool (the workflow's steps call it)."""

    def __init__(self, pool: ServerPool, worker_id: str) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.draining = threading.Event()  # stopping: no job takes a server any more
        self.stop = threading.Event()  # stopped: DBOS is down, nothing more is recorded
        self.in_flight = InFlight()  # the prompts out on servers, taken off them if the worker stops early
        self._on_servers: Counter[str] = Counter()  # batch name -> its jobs holding a server slot now
        self._lock = threading.Lock()

    def run_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """The job workflow's body: attempts until success, a job fault, or ``max_attempts``."""
        log: list[dict[str, Any]] = []
        outcome: dict[str, Any] = {}
        for _ in range(int(job["max_attempts"])):
            outcome = DBOS.run_step({"name": "attempt"}, self.attempt, job, len(log) + 1)
            for lost in outcome.pop("lost", []):  # a worker died during it: it ran, and is counted
                log.append({"attempt": len(log) + 1, "server": lost["server"], **LOST_ATTEMPT})
            log.append({k: outcome.get(k) for k in ("attempt", "server", "status", "fault", "seconds")})
            if outcome["status"] == "success" or outcome.get("fault") != "server":
                break
        record = {**outcome, "attempts": len(log), "attempt_log": log}
        if record["status"] != "success" and record.get("fault") == "server":
            record["error"] = {
                **record["error"],
                "message": f"gave up after {len(log)} attempt(s); last: {record['error']['message']}",
            }
        return record

    def attempt(self, job: dict[str, Any], attempt: int) -> dict[str, Any]:
        """One attempt (a DBOS step): the finished record if the job's folder exists, else a run."""
        done, problem = inspect_folder(job)
        if done is not None:
            logger.info("job %s: results already in place; not run again", job["job_id"])
            return done
        if problem is not None:  # checked before a server is taken
            return output_fault(job, server=None, worker=self.worker_id, attempt=attempt, message=problem)
        left = f"job {job['job_id']}: the worker stopped before it took a server"
        # a dead worker's prompt of this job comes off its server before this job waits for one: left
        # there, it ran on while newer jobs queued behind it on that server
        lost = take_off_orphans(job, Path(job["out_dir"]) / PARTIAL_DIR, headers_for=self.pool.headers_for)
        try:
            server = self.pool.acquire(self.draining)
        except ServerError:
            if self.draining.is_set():
                raise LeftForLater(left) from None
            raise
        failed = False
        with self._lock:
            self._on_servers[job["batch"]] += 1
        try:
            if self.draining.is_set():  # the worker began stopping as this job got its slot
                raise LeftForLater(left)
            workflow_id = DBOS.workflow_id
            outcome = run_attempt(
                job,
                server,
                worker=self.worker_id,
                attempt=attempt,
                cancelled=lambda: is_cancelled(workflow_id),
                in_flight=self.in_flight,
                lost=lost,
                headers_for=self.pool.headers_for,
            )
            failed = outcome.get("fault") == "server"
            return outcome
        finally:
            with self._lock:
                self._on_servers[job["batch"]] -= 1
            self.pool.release(server, server_failed=failed, reason="a job lost it")

    def on_servers(self, batch: str) -> int:
        """How many of ``batch``'s jobs hold a server slot of this worker now."""
        with self._lock:
            return self._on_servers[batch]


def _not_a_registration_again(record: logging.LogRecord) -> bool:
    return f"registration of function '{JOB_WORKFLOW}'" not in record.getMessage()


def register_job_workflow(runner: JobRunner) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Register the job workflow, bound to ``runner``, under :data:`JOB_WORKFLOW` (again: the last
    registration in a process wins, which is how a second worker in one process gets its pool)."""

    dbos_log = logging.getLogger("dbos")
    dbos_log.addFilter(_not_a_registration_again)  # DBOS warns of each after the first; this one is meant
    try:

        @DBOS.workflow(name=JOB_WORKFLOW)
        def run_batch_job(job: dict[str, Any]) -> dict[str, Any]:
            return runner.run_job(job)

    finally:
        dbos_log.removeFilter(_not_a_registration_again)
    return run_batch_job
