"""A batch on the durable DBOS queue: submit it, read its jobs' states, cancel and retry them.

Every job is one DBOS workflow, named :data:`JOB_WORKFLOW`, on the queue :data:`QUEUE`, with the
workflow id ``<batch>/<job id>`` (``<batch>/<job id>/retry-N`` for a retry). The ids make a submit
idempotent: submitting the same batch again (after the submitting process was killed, say) queues
nothing twice. The job spec is the workflow's input and holds everything a worker on any machine
needs (the API prompt with its overrides applied, where its files go, timeouts, attempts); the
workflow's output is the job's result record.

The queue lives in DBOS's system database: a SQLite file (one machine) or Postgres (many machines,
each running ``leanvideo batch worker``). This module only uses a :class:`dbos.DBOSClient`; running
jobs is :mod:`runner.batch.worker`'s.

Example::

    with open_client(resolve_db_url(None, workspace_root)) as client:
        submit_batch(client, "nightly", jobs, BatchSettings(out_dir=Path("out/nightly")))
        for job in list_jobs(client, "nightly"):
            print(job.job_id, job.state)
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSClient, EnqueueOptions

from runner.batch.attempt import PARTIAL_DIR, finished_record, occupant_problem
from runner.batch.database_url import database_error_text, redact_db_url, sqlite_file, with_connect_timeout
from runner.batch.jobs_file import PreparedJob
from runner.batch.orphans import take_off_orphans
from runner.errors import LeanVideoError, UsageError
from runner.local.out_folder import check_out_folder

logger = logging.getLogger(__name__)

APP_NAME = "leanvideo"
APP_VERSION = "leanvideo-batch-1"  # the job spec's format: workers dequeue only their own version
QUEUE = "leanvideo-batch"
JOB_WORKFLOW = "leanvideo.batch.job"
ID_QUERY_SLICE = 500  # workflow ids per query (SQLite allows 32766 variables, older builds 999)
BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")

# DBOS workflow status → the job's state (a SUCCESS workflow is a job whose record says success|failed)
STATES = {
    "ENQUEUED": "queued",
    "DELAYED": "queued",
    "PENDING": "running",
    "CANCELLED": "cancelled",
    "ERROR": "error",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "error",
}
FINAL_STATES = ("success", "failed", "cancelled", "error")


@dataclass(frozen=True)
class BatchSettings:
    """What every job of a batch shares."""

    out_dir: Path
    max_attempts: int = 3
    timeout: float = 1800.0  # per attempt
    health_timeout: float = 30.0  # a server silent this long has failed the attempt

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError(f"max_attempts must be ≥ 1, got {self.max_attempts}")
        if self.timeout <= 0 or self.health_timeout <= 0:
            raise UsageError("timeout and health_timeout must be positive")


@dataclass(frozen=True)
class JobState:
    """One job of a batch as the queue knows it; ``record`` is its result once it has one."""

    job_id: str
    workflow_id: str
    state: str  # queued | running | success | failed | cancelled | error
    record: dict[str, Any] | None
    created_ms: int | None
    completed_ms: int | None
    error: str | None = None
    worker: str | None = None  # the DBOS executor that holds or last held the job


def check_batch_name(name: str, *, where: str = "batch name") -> str:
    """``name`` when it can name a batch (it names folders and workflow ids), else :class:`UsageError`."""
    if not BATCH_NAME.match(name):
        raise UsageError(
            f"{where} {name!r}: 1-80 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def _not_a_maintenance_warning(record: logging.LogRecord) -> bool:
    """Drops DBOS's "Could not connect to postgres database to verify existence of …", said before the
    error that follows it whenever the server does not answer."""
    return not record.getMessage().startswith("Could not connect to postgres database to verify")


@contextmanager
def open_client(db_url: str) -> Iterator[DBOSClient]:
    """A client of the queue's database, created (and its schema migrated) on first use."""
    dbos_log = logging.getLogger("dbos")
    dbos_log.addFilter(_not_a_maintenance_warning)  # the error below says why the database is unusable
    try:
        if (database := sqlite_file(db_url)) is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
        DBOS.migrate(with_connect_timeout(db_url))
        client = DBOSClient(system_database_url=with_connect_timeout(db_url), application_name=APP_NAME)
    except Exception as exc:  # SQLAlchemy / psycopg errors: the database cannot be used
        said = database_error_text(exc)
        raise LeanVideoError(f"cannot open the batch database {redact_db_url(db_url)}: {said}") from exc
    finally:
        dbos_log.removeFilter(_not_a_maintenance_warning)
    try:
        yield client
    finally:
        client.destroy()


def job_spec(name: str, job: PreparedJob, settings: BatchSettings) -> dict[str, Any]:
    """The queued input of one job: all a worker needs, JSON only."""
    spec: dict[str, Any] = {
        "batch": name,
        "job_id": job.job_id,
        "line": job.line,
        "workflow": str(job.workflow),
        "overrides": list(job.overrides),
        "prompt": job.prompt,
        "out_dir": str(settings.out_dir.resolve()),
        "max_attempts": settings.max_attempts,
        "timeout": settings.timeout,
        "health_timeout": settings.health_timeout,
    }
    spec["digest"] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return spec


def submit_batch(
    client: DBOSClient, name: str, jobs: list[PreparedJob], settings: BatchSettings, *, add: bool = False
) -> int:
    """Queue every job of the batch ``name``; returns how many were new (0 when it was all queued, so
    submitting a file again is harmless). Jobs new to a batch that exists are queued only with ``add``.

    Raises:
        UsageError: a batch of that name has jobs of these ids with other settings (choose another
            ``--name``), or would get new jobs without ``add``, or job folders are taken; nothing is
            queued.
    """
    check_batch_name(name)
    out = settings.out_dir
    check_out_folder(out, create=False, after="; nothing was queued")
    specs = [job_spec(name, job, settings) for job in jobs]
    existing = {
        status.workflow_id: (status.attributes or {}).get("digest")
        for status in client.list_workflows(
            workflow_id_prefix=f"{name}/", load_input=False, load_output=False
        )
    }
    clashes = [
        s["job_id"] for s in specs if f"{name}/{s['job_id']}" in existing
        and existing[f"{name}/{s['job_id']}"] != s["digest"]
    ]  # fmt: skip
    if clashes:
        differ = _settings_that_differ(client, name, next(s for s in specs if s["job_id"] == clashes[0]))
        raise UsageError(
            f"batch {name!r} already has jobs with the ids {', '.join(clashes[:10])} but other settings "
            f"({differ}); submit under another --name"
        )
    fresh = [s["job_id"] for s in specs if f"{name}/{s['job_id']}" not in existing]
    if existing and fresh and not add:
        held = len({workflow_id.split("/")[1] for workflow_id in existing})
        ids = ", ".join(fresh[:10]) + (f" … ({len(fresh)})" if len(fresh) > 10 else "")
        raise UsageError(
            f"batch {name!r} already has {held} job(s), and this jobs file has {len(fresh)} it does not "
            f"(ids {ids}); nothing was queued. Submit it under another --name, or with --add to add "
            f"them to batch {name!r}"
        )
    # only for jobs queued now: a job already in the batch says a folder taken since, when it runs
    taken = [
        f"job {s['job_id']}: {problem}"
        for s in specs
        if s["job_id"] in fresh and (problem := occupant_problem(s)) is not None
    ]
    if taken:
        listed = "\n  ".join(taken[:20]) + (f"\n  … and {len(taken) - 20} more" if len(taken) > 20 else "")
        raise UsageError(f"batch {name!r}: nothing was queued; job folders are taken:\n  {listed}")
    queued = 0
    for spec in specs:
        workflow_id = f"{name}/{spec['job_id']}"
        if workflow_id in existing:
            continue
        options: EnqueueOptions = {
            "workflow_name": JOB_WORKFLOW,
            "queue_name": QUEUE,
            "workflow_id": workflow_id,
            "app_version": APP_VERSION,
            "attributes": {"batch": name, "job": spec["job_id"], "digest": spec["digest"]},
        }
        priority = next(j.priority for j in jobs if j.job_id == spec["job_id"])
        if priority is not None:
            options["priority"] = priority
        client.enqueue(options, spec)
        queued += 1
    logger.info("batch %s: %d job(s) queued, %d already there", name, queued, len(specs) - queued)
    return queued


# A job's settings, as a user gives them, in the order they are named when a resubmission differs
SETTING_NAMES = {
    "workflow": "workflow file",
    "prompt": "workflow content",
    "overrides": "overrides",
    "out_dir": "--out",
    "timeout": "--timeout",
    "max_attempts": "--max-attempts",
    "health_timeout": "--health-timeout",
    "line": "line in the jobs file",
}


def _settings_that_differ(client: DBOSClient, name: str, spec: dict[str, Any]) -> str:
    """Which settings of ``spec`` differ from those its job was queued with (said as the user gives
    them: ``--out``, ``overrides``, …); the whole list when they cannot be read."""
    queued = client.list_workflows(workflow_ids=[f"{name}/{spec['job_id']}"], load_output=False)
    before = (
        queued[0].input["args"][0] if queued and queued[0].input and queued[0].input.get("args") else None
    )
    if not isinstance(before, dict):
        return "workflow, overrides, --out, --timeout, --max-attempts or --health-timeout"
    differ = [
        f"--out: {before.get('out_dir')} then, {spec['out_dir']} now" if key == "out_dir" else said
        for key, said in SETTING_NAMES.items()
        if before.get(key) != spec.get(key)
    ]
    return ", ".join(differ) or "the queued job's format"


def list_jobs(client: DBOSClient, name: str) -> list[JobState]:
    """The current state of every job of batch ``name`` (its latest run when it was retried)."""
    latest: dict[str, JobState] = {}
    for status in client.list_workflows(workflow_id_prefix=f"{name}/", load_input=False):
        job_id = (status.attributes or {}).get("job") or status.workflow_id.split("/")[1]
        record = status.output if isinstance(status.output, dict) else None
        if status.status == "SUCCESS":
            state = str(record.get("status", "error")) if record else "error"
        else:
            state = STATES.get(status.status, status.status.lower())
        job = JobState(
            job_id=str(job_id),
            workflow_id=status.workflow_id,
            state=state,
            record=record,
            created_ms=status.created_at,
            completed_ms=status.completed_at,
            error=str(status.error) if status.error is not None else None,
            worker=status.executor_id,
        )
        previous = latest.get(job.job_id)
        if previous is None or (job.created_ms or 0) >= (previous.created_ms or 0):
            latest[job.job_id] = job
    if cancelled := [job.workflow_id for job in latest.values() if job.state == "cancelled"]:
        latest |= _finished_after_cancel(client, cancelled)
    return sorted(latest.values(), key=lambda j: (j.created_ms or 0, j.job_id))


def _finished_after_cancel(client: DBOSClient, workflow_ids: list[str]) -> dict[str, JobState]:
    """Cancelled jobs whose prompt finished before the cancel reached it: their folder is in place with
    their result, so that is their state (a job is checked for a cancel at most once a second)."""
    finished: dict[str, JobState] = {}
    statuses = [  # in slices: a database bounds how many ids one query may name
        status
        for start in range(0, len(workflow_ids), ID_QUERY_SLICE)
        for status in client.list_workflows(
            workflow_ids=workflow_ids[start : start + ID_QUERY_SLICE], load_output=False
        )
    ]
    for status in statuses:
        spec = status.input["args"][0] if status.input and status.input.get("args") else None
        if not isinstance(spec, dict) or "out_dir" not in spec:
            continue
        if (record := finished_record(spec)) is not None:
            job_id = str(spec["job_id"])
            finished[job_id] = JobState(
                job_id=job_id,
                workflow_id=status.workflow_id,
                state=str(record.get("status", "error")),
                record=record,
                created_ms=status.created_at,
                completed_ms=status.updated_at,
                worker=status.executor_id,
            )
    return finished


class NoSuchBatchError(LeanVideoError):
    """No job of batch ``name`` is in the database (``where``: which, when the caller knows)."""

    def __init__(self, name: str, where: str = "this database") -> None:
        super().__init__(f"no batch named {name!r} in {where}")
        self.name = name


def batch_jobs(client: DBOSClient, name: str) -> list[JobState]:
    """:func:`list_jobs` of a batch that must exist.

    Raises:
        LeanVideoError: no job of batch ``name`` is in this database.
    """
    jobs = list_jobs(client, name)
    if not jobs:
        raise NoSuchBatchError(name)
    return jobs


def cancel_batch(
    client: DBOSClient,
    name: str,
    *,
    headers: Mapping[str, str] | None = None,
    left: list[dict[str, str]] | None = None,
) -> int:
    """Cancel every queued or running job of the batch; returns how many (a batch that does not exist
    raises, see :func:`batch_jobs`). The prompts a dead worker left on servers for the batch's
    cancelled jobs (these, and those cancelled before whose prompts could not be taken off then) are
    taken off, ``headers`` sent to their servers; those that still cannot be are added to ``left``."""
    jobs = batch_jobs(client, name)
    ids = [j.workflow_id for j in jobs if j.state in ("queued", "running")]
    if ids:
        client.cancel_workflows(ids)
    # A worker killed mid-job left its prompt running: no attempt of a cancelled job comes to take it
    # off, so the cancel does (a live worker's own prompt is stopped anyway; its folder stays its own).
    cancelled = ids + [j.workflow_id for j in jobs if j.state == "cancelled"]
    for status in client.list_workflows(workflow_ids=cancelled, load_output=False) if cancelled else []:
        spec = status.input["args"][0] if status.input else None
        if isinstance(spec, dict) and "out_dir" in spec:
            partial = Path(spec["out_dir"]) / PARTIAL_DIR
            take_off_orphans(
                spec,
                partial,
                keep_folders=True,
                why="the job was cancelled",
                headers_for=lambda server: headers or {},
                left=left,
            )
    return len(ids)


def retry_batch(client: DBOSClient, name: str, *, failed: bool = False) -> list[str]:
    """Put the batch's cancelled jobs back on the queue (where they stopped) and run its errored ones
    again as new runs (DBOS does not resume a workflow that raised); with ``failed`` also jobs whose
    result is a failure. Returns the job ids (a batch that does not exist raises, see :func:`batch_jobs`)."""
    jobs = batch_jobs(client, name)
    resume = [j for j in jobs if j.state == "cancelled"]
    if resume:
        client.resume_workflows([j.workflow_id for j in resume], queue_name=QUEUE)
    rerun = [j for j in jobs if j.state == "error" or (failed and j.state == "failed")]
    for job in rerun:
        (status,) = client.list_workflows(workflow_ids=[job.workflow_id], load_output=False)
        spec = status.input["args"][0] if status.input else None
        if not isinstance(spec, dict):
            raise LeanVideoError(f"job {job.job_id} of batch {name}: its queued spec cannot be read")
        generation = len(client.list_workflows(workflow_id_prefix=f"{name}/{job.job_id}/", load_output=False))
        options: EnqueueOptions = {
            "workflow_name": JOB_WORKFLOW,
            "queue_name": QUEUE,
            "workflow_id": f"{name}/{job.job_id}/retry-{generation + 1}",
            "app_version": APP_VERSION,
            "attributes": {"batch": name, "job": job.job_id, "digest": spec.get("digest")},
        }
        client.enqueue(options, spec)
    return [j.job_id for j in resume + rerun]


def hand_back_jobs(client: DBOSClient, worker_id: str) -> list[str]:
    """Put the jobs ``worker_id`` left unfinished (pending under its executor id: waiting for a server,
    or taken off one when ``--grace`` ran out) back on the queue, where any worker takes them; returns
    their workflow ids. Only for a worker that has stopped: DBOS down in its process, its prompts off.
    Left pending, they would wait for a worker of that very id (a ``submit --wait`` of another batch
    holds jobs of this one too)."""
    held = client.list_workflows(
        status="PENDING", executor_id=worker_id, name=JOB_WORKFLOW, load_input=False, load_output=False
    )
    ids = [status.workflow_id for status in held]
    if ids:
        client.resume_workflows(ids, queue_name=QUEUE)
    return ids
