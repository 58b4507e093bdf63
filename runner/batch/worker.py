"""Run a batch's jobs: a DBOS executor that takes jobs off the shared queue onto its servers.

A :class:`BatchWorker` launches DBOS in this process (DBOS allows one executor per process) with the job
workflow registered (its body: :class:`~runner.batch.job_runner.JobRunner`), and takes up to
``per_server × servers`` jobs at once from the queue, plus :data:`PREFETCH` waiting for the next free
slot (DBOS picks up queued work every :data:`POLLING_INTERVAL_S`; a job already taken starts the moment
a slot frees). DBOS keeps one such limit per queue, in its database: the worker started last sets it for
all. The job workflow is durable; its only step is one attempt on one server
(:mod:`runner.batch.attempt`), so what DBOS records is the outcome of each attempt:

- an attempt that fails because its **server** stopped answering is followed by another, on the
  least busy healthy server (the failed one is out of the pool until a probe answers), up to the
  job's ``max_attempts``; when every server has been out :data:`STAND_DOWN_S`, the worker gives its
  jobs back to the queue until one answers (:meth:`BatchWorker.check_servers`);
- a **workflow** fault or a **timeout** ends the job as failed, with the node id and message;
- the job's **result record** is the workflow's output: exactly one per job id, with every attempt in
  its ``attempt_log``, also one whose worker died while its prompt ran (``"status": "lost"``, fault
  ``worker``: the next attempt found its prompt and took it off the server).

A worker that stops (Ctrl-C, ``--grace``) lets the jobs whose prompts are out on servers finish; a job
still waiting for a free server (all of them out, or busy) leaves at once, unrecorded
(:class:`~runner.batch.job_runner.LeftForLater`). Once DBOS is down and the prompts of jobs still
running are off their servers, every job the worker left unfinished goes back on the queue, where any
worker takes it (:func:`~runner.batch.queue.hand_back_jobs`): a ``submit --wait`` takes other batches'
queued jobs too, and would otherwise leave them to a worker of its own id.

When the process dies, DBOS puts the jobs it was running back on the queue the next time a worker with
the same ``worker_id`` starts (by default this machine's name and its server list, so restarting the
same command recovers them; two live workers never share an id: :mod:`runner.batch.worker_ids`); any
worker then takes them. An attempt that had finished but was not recorded yet finds its folder in place
and runs nothing (:func:`runner.batch.attempt.finished_record`).

Example::

    pool = ServerPool(["http://127.0.0.1:8188"], per_server=1)
    with BatchWorker(db_url, pool):
        ...  # jobs run in DBOS's threads until the block ends
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from types import TracebackType

from dbos import DBOS

from runner.batch.database_full import DatabaseFullWatch, DatabaseOutageQuiet
from runner.batch.database_url import database_error_text, redact_db_url
from runner.batch.job_noise import CancelledJobNoise
from runner.batch.job_runner import JobRunner, register_job_workflow
from runner.batch.orphans import cancel_left_prompts
from runner.batch.pool import ServerPool
from runner.batch.queue import APP_NAME, APP_VERSION, QUEUE, hand_back_jobs, open_client
from runner.batch.worker_ids import default_worker_id, hold_worker_id
from runner.errors import LeanVideoError, ServerError

logger = logging.getLogger(__name__)

POLLING_INTERVAL_S = 0.2  # how often an idle worker looks at the queue
PREFETCH = 1  # jobs taken beyond the free slots: the next one starts as soon as a slot frees
DEFAULT_GRACE_S = 600  # on stop, how long running jobs get to finish
HAND_BACK_WAIT_S = 10.0  # on stop, how long attempts whose prompts came off get to see it, before hand-back
HAND_BACK_DB_WAIT_S = 120.0  # on stop, how long a database that does not answer is waited for to hand back
HAND_BACK_RETRY_S = 5.0
FIRST_ANSWER_WAIT_S = 5.0  # how long a starting worker waits for a server before saying none answers
STAND_DOWN_S = 60.0  # none of its servers answering this long, a worker gives its jobs back (check_servers)


class BatchWorker:
    """DBOS launched in this process, taking jobs off :data:`QUEUE` onto ``pool``'s servers."""

    def __init__(
        self,
        db_url: str,
        pool: ServerPool,
        *,
        worker_id: str | None = None,
        grace: int = DEFAULT_GRACE_S,
        log_level: str = "WARNING",
        stand_down_after: float = STAND_DOWN_S,
    ) -> None:
        self.db_url = db_url
        self.pool = pool
        self.worker_id = worker_id or default_worker_id(pool.urls)
        self.grace = grace
        self.log_level = log_level
        self.stand_down_after = stand_down_after
        self.runner = JobRunner(pool, self.worker_id)
        self._quiet = CancelledJobNoise()
        self._full = DatabaseFullWatch()
        self._down = DatabaseOutageQuiet(logger, redact_db_url(db_url))
        self._filters: tuple[logging.Filter, ...] = (self._quiet, self._full, self._down)
        self._held = contextlib.ExitStack()
        self._launched = False
        self.handed_back = 0  # unfinished jobs put back on the queue when the worker stopped
        self.stranded = False  # they could not be: they wait for a worker of this id
        self.stood_down = 0  # times it gave its jobs back because none of its servers answered

    def __enter__(self) -> BatchWorker:
        self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop taking jobs, give running ones ``grace`` seconds (none when the database can no longer be
        written: they could not record what they did), then shut DBOS down and hand what is unfinished
        back to the queue (with a full database, it waits for a worker of this id)."""
        if self._launched:  # not when Ctrl-C came while a stood-down worker waited for a server
            self.handed_back = self._stop(0 if self._full.failure is not None else self.grace)

    def check_servers(self) -> None:
        """Stand down when none of the pool's servers has answered for ``stand_down_after`` seconds and
        no job is on one: the jobs this worker took go back on the queue, for workers whose servers
        answer (they waited here, held, until one of these came back), and it takes jobs again once
        one of its servers answers. Returns at once otherwise; while standing down, not before then."""
        out = self.pool.all_out_for()
        if out is None or out < self.stand_down_after:
            return
        handed = self._stop(0)
        self.stood_down += 1
        logger.warning(
            "worker %s: none of its servers (%s) has answered for %.0f s: %d job(s) it held went back "
            "on the queue, for other workers (or for this one once one of its servers answers)",
            self.worker_id,
            ", ".join(self.pool.urls),
            self.stand_down_after,
            handed,
        )
        self.runner = JobRunner(self.pool, self.worker_id)  # _start binds the job workflow to it
        self._start()

    def _start(self) -> None:
        """Launch DBOS once a server answers, holding the worker id; taking jobs from then on."""
        self._held.enter_context(hold_worker_id(self.worker_id, self.db_url))  # refused when held
        try:
            self._wait_for_a_server()
            register_job_workflow(self.runner)
            self._quiet.shut_down = False
            for dbos_filter in self._filters:
                logging.getLogger("dbos").addFilter(dbos_filter)
            DBOS(
                config={
                    "name": APP_NAME,
                    "system_database_url": self.db_url,
                    "application_version": APP_VERSION,
                    "executor_id": self.worker_id,
                    "log_level": self.log_level,
                }
            )
            DBOS.launch()
            DBOS.register_queue(
                QUEUE,
                worker_concurrency=self.pool.slots + PREFETCH,
                polling_interval_sec=POLLING_INTERVAL_S,
                on_conflict="always_update",
            )
        except BaseException:
            DBOS.destroy()
            self._remove_filters()
            self._held.close()
            raise
        self._launched = True
        logger.info("worker %s takes up to %d job(s) from %s", self.worker_id, self.pool.slots, QUEUE)

    def _stop(self, grace: int) -> int:
        """Shut DBOS down after ``grace`` seconds for running jobs, their prompts off the servers, and
        hand the unfinished jobs back; how many went back."""
        self._launched = False
        self.runner.draining.set()  # jobs waiting for a server leave now; those on one get the grace
        if grace <= 0:
            self.runner.stop.set()
        self._quiet.shut_down = True
        handed = 0
        try:
            try:
                DBOS.destroy(workflow_completion_timeout_sec=grace)
            except KeyboardInterrupt:  # Ctrl-C again while running jobs finish: stop now, as --grace 0
                logger.warning(
                    "worker %s: stopping now: the running jobs' prompts are taken off their servers and "
                    "the jobs go back on the queue",
                    self.worker_id,
                )
                self.runner.stop.set()
                DBOS.destroy(workflow_completion_timeout_sec=0)  # what the interrupted destroy left
            # DBOS is down: nothing more is recorded. Jobs still running stay unfinished; their prompts
            # come off the servers, none starts any more, and only then may another worker take this id
            # (and those jobs). Interrupted a third time, the id stays held until this process ends.
            left = self.runner.in_flight.close()
            self.runner.stop.set()
            cancel_left_prompts(left, self.worker_id, self.pool.headers_for)
            if self._full.failure is None:  # a full database takes no write: they wait for this id
                handed = self._hand_back()
            self._held.close()
        finally:
            # Jobs still running log their failure to record later, from their own threads: the filter
            # stays for them (it drops only those records)
            if not any(server.running for server in self.pool.snapshot()):
                self._remove_filters()
        return handed

    def _wait_for_a_server(self) -> None:
        """Return once a server of the pool answers: a worker whose servers were all down took jobs off
        the shared queue and held them, while other workers sat idle."""
        quick = threading.Event()
        timer = threading.Timer(FIRST_ANSWER_WAIT_S, quick.set)
        timer.start()
        try:
            url = self.pool.acquire(quick)
        except ServerError:
            logger.warning(
                "worker %s: none of its servers (%s) answers; it takes no job until one does",
                self.worker_id,
                ", ".join(self.pool.urls),
            )
            url = self.pool.acquire(self.runner.draining)  # set: given up (a test), Ctrl-C raises instead
            logger.warning("worker %s: %s answers; taking jobs", self.worker_id, url)
        finally:
            timer.cancel()
        self.pool.release(url)

    def _remove_filters(self) -> None:
        for dbos_filter in self._filters:
            logging.getLogger("dbos").removeFilter(dbos_filter)

    def _hand_back(self) -> int:
        """The jobs this worker left unfinished back on the queue for any worker (see
        :func:`~runner.batch.queue.hand_back_jobs`); on failure they wait for a worker of this id."""
        deadline = time.monotonic() + HAND_BACK_WAIT_S  # attempts whose prompts were taken off end first
        while self.runner.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        began, said = time.monotonic(), False
        while True:
            try:
                if said:  # waited here, a Ctrl-C taken as stopping the wait
                    time.sleep(HAND_BACK_RETRY_S)
                with open_client(self.db_url) as client:
                    ids = hand_back_jobs(client, self.worker_id)
                break
            except (Exception, KeyboardInterrupt) as exc:  # the database does not answer (an outage)
                gave_up = (
                    isinstance(exc, KeyboardInterrupt) or time.monotonic() - began >= HAND_BACK_DB_WAIT_S
                )
                if gave_up:
                    self.stranded = True
                    logger.error(
                        "worker %s: could not put its unfinished jobs back on the queue (%s): they wait for "
                        "a worker with its id; run the same command again (or batch worker --worker-id %s) "
                        "once the database answers",
                        self.worker_id,
                        "stopped while waiting"
                        if isinstance(exc, KeyboardInterrupt)
                        else database_error_text(exc),
                        self.worker_id,
                    )
                    return 0
                if not said:
                    said = True
                    logger.warning(
                        "worker %s: the batch database does not answer (%s): waiting up to %.0f s to put its "
                        "unfinished jobs back on the queue (Ctrl-C leaves them for a worker with its id)",
                        self.worker_id,
                        database_error_text(exc),
                        HAND_BACK_DB_WAIT_S,
                    )
        if ids:
            logger.info("worker %s handed %d unfinished job(s) back to the queue", self.worker_id, len(ids))
        return len(ids)

    def running_jobs(self, batch: str | None = None) -> int:
        """Jobs whose prompts are out on servers now (``batch``'s only, when given): those a stop gives
        ``grace`` seconds to finish."""
        if batch is not None:
            return self.runner.on_servers(batch)
        return sum(server.running for server in self.pool.snapshot())

    @property
    def database_out(self) -> bool:
        """Whether the batch database does not answer now (an outage going on)."""
        return self._down.out

    def check_database(self) -> None:
        """Raise :class:`LeanVideoError` once DBOS has failed to write the database for a full disk
        (:mod:`runner.batch.database_full`); the caller leaves the ``with`` block and the worker stops.
        Says when a database that did not answer answers again."""
        self._down.check_answers_again()
        if (failure := self._full.failure) is not None:
            raise LeanVideoError(
                f"the batch database {redact_db_url(self.db_url)} can no longer be written: {failure}. "
                "Stopped. Jobs that had not ended stay in it: free some space and run the same command again "
                f"(this worker's running jobs resume under its id {self.worker_id})"
            )
