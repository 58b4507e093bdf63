"""Noticing, from DBOS's own log, that the batch database can no longer be written because its disk is
full.

DBOS records every job's progress from its own threads. When the disk under the database fills, each of
those writes fails, and DBOS logs the traceback and tries again, for ever: its queue thread alone logs
once per polling interval. A `batch submit --wait` or `batch worker` on a full disk printed thousands
of lines and never ended. :class:`DatabaseFullWatch`, a filter on DBOS's logger, recognises these
failures, keeps the first one's message and drops the records; the worker asks :attr:`failure` and
stops with one error (:meth:`runner.batch.worker.BatchWorker.check_database`).

Example::

    watch = DatabaseFullWatch()
    logging.getLogger("dbos").addFilter(watch)
    ...
    if watch.failure is not None:
        print("the database cannot be written:", watch.failure)
"""

from __future__ import annotations

import logging
import threading
import time

# What a full disk says: SQLite's SQLITE_FULL; PostgreSQL's disk_full ("could not extend file …: No
# space left on device", "could not write to file …"), psycopg's DiskFull
FULL_MARKERS = ("database or disk is full", "No space left on device", "DiskFull")
_CHAIN_DEPTH = 8  # how far along an exception's causes to look


def full_disk_message(record: logging.LogRecord) -> str | None:
    """The line of ``record`` (its message, or an exception in its chain) that says the database's disk
    is full; ``None`` for any other record."""
    return _line_with(record, FULL_MARKERS)


def _line_with(record: logging.LogRecord, markers: tuple[str, ...]) -> str | None:
    """The first line of ``record``'s message or of an exception in its chain holding one of ``markers``."""
    texts = [record.getMessage()]
    error = record.exc_info[1] if record.exc_info else None
    for _ in range(_CHAIN_DEPTH):
        if error is None:
            break
        texts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    for text in texts:
        for line in text.splitlines():
            if any(marker in line for marker in markers):
                return line.strip()
    return None


class DatabaseFullWatch(logging.Filter):
    """Drops DBOS's records of a full database disk, keeping the first one's line in :attr:`failure`."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        with self._lock:
            return self._failure

    def filter(self, record: logging.LogRecord) -> bool:
        line = full_disk_message(record)
        if line is None:
            return True
        with self._lock:
            if self._failure is None:
                self._failure = line
        return False


# What a database that does not answer says (PostgreSQL stopped, restarting, or the network to it cut):
# psycopg's and SQLAlchemy's connection errors, and the server's own words when it shuts down
OUTAGE_MARKERS = (
    "connection failed",
    "Connection refused",
    "could not connect",
    "server closed the connection",
    "terminating connection",
    "the database system is shutting down",
    "the database system is starting up",
    "consuming input failed",
    "connection is closed",
    "timeout expired",  # psycopg's ConnectionTimeout: a host that takes connections and says nothing
    "Connection timed out",
    "could not receive data from server",
    "could not send data to server",
    "SSL connection has been closed unexpectedly",
)
OUTAGE_SAY_EVERY_S = 60.0
# Without an outage record for this long, the database answers again (DBOS's queue thread polls it
# every fraction of a second; a connection that times out takes 10 s to say so)
ANSWERS_AGAIN_AFTER_S = 30.0


class DatabaseOutageQuiet(logging.Filter):
    """Drops DBOS's records of a database that does not answer (it retries each write, and each of its
    threads logs every failure with its traceback: a 30 s PostgreSQL restart printed 3,800 lines) and
    says instead, at most once a minute, one line on ``logger``; nothing is lost: DBOS retries."""

    def __init__(self, logger: logging.Logger, database: str) -> None:
        super().__init__()
        self._logger = logger
        self._database = database
        self._lock = threading.Lock()
        self._said_at: float | None = None
        self._began: float | None = None  # the first record of the outage going on
        self._last: float | None = None  # its latest record
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        line = _line_with(record, OUTAGE_MARKERS)
        if line is None:
            return True
        now = time.monotonic()
        with self._lock:
            self.dropped += 1
            self._began = now if self._began is None else self._began
            self._last = now
            say = self._said_at is None or now - self._said_at >= OUTAGE_SAY_EVERY_S
            if say:
                self._said_at = now
        if say:
            self._logger.warning(
                "the batch database %s does not answer (%s); retrying: jobs on servers run on, and what "
                "they did is recorded once it answers",
                self._database,
                line[:200],
            )
        return False

    @property
    def out(self) -> bool:
        """Whether the database is out now: it did not answer within :data:`ANSWERS_AGAIN_AFTER_S`."""
        with self._lock:
            return self._last is not None and time.monotonic() - self._last < ANSWERS_AGAIN_AFTER_S

    def check_answers_again(self) -> None:
        """Say, once, that the database answers again when its outage's records stopped
        :data:`ANSWERS_AGAIN_AFTER_S` ago (the worker calls this as it waits)."""
        now = time.monotonic()
        with self._lock:
            if self._began is None or self._last is None or now - self._last < ANSWERS_AGAIN_AFTER_S:
                return
            began, last = self._began, self._last
            self._began = self._last = self._said_at = None
        self._logger.warning(
            "the batch database %s answers again (it did not for at least %.0f s); jobs are recorded",
            self._database,
            last - began,
        )
