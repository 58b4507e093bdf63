"""Which of DBOS's log records about a batch's jobs are expected, and dropped.

``batch cancel`` cancels a job workflow in the database; DBOS logs a traceback for it in the worker
that ran it, and, once a worker has shut DBOS down before its jobs ended (``--grace`` ran out), every
such job's thread logs its failure to record what it did. Both are what the worker meant to happen.
"""

from __future__ import annotations

import logging
import re

from dbos import DBOS


def is_cancelled(workflow_id: str | None, *, quiet: bool = False) -> bool:
    """Whether ``batch cancel`` cancelled the job workflow (DBOS itself stops it only between steps);
    ``quiet``: ``False`` where DBOS cannot tell (shut down, its database gone)."""
    if workflow_id is None:
        return False
    try:
        status = DBOS.get_workflow_status(workflow_id)
    except Exception:
        if quiet:
            return False
        raise
    return status is not None and status.status == "CANCELLED"


class CancelledJobNoise(logging.Filter):
    """Drops DBOS's tracebacks that are expected: for workflows that ``batch cancel`` cancelled, and,
    once the worker shut DBOS down before its jobs ended (``--grace`` ran out), for those jobs' threads
    failing to record what they did (they go back on the queue). DBOS's warning that a workflow "is no
    longer owned by this execution" is dropped for a workflow that was cancelled (expected after
    ``batch cancel``, and printed into the live progress view) and kept otherwise: two machines given
    one --worker-id (which no local lock can see) cause it too. Once shut down, DBOS's own complaints
    of being used after that, or of its threads still waiting for a database that does not answer, are
    dropped too."""

    NAMES = ("DBOSAwaitedWorkflowCancelledError", "DBOSWorkflowCancelledError")
    SHUT_DOWN = "accessed before DBOS was launched"
    # a shut-down DBOS's queue thread still waiting for its database (an outage): the stop goes on
    THREAD_LEFT = "did not exit within timeout"
    NOT_OWNED = re.compile(r"Workflow (\S+) (?:outcome was not recorded: the workflow )?is no longer owned")

    def __init__(self) -> None:
        super().__init__()
        self.shut_down = False

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if self.shut_down and any(said in record.getMessage() for said in (self.SHUT_DOWN, self.THREAD_LEFT)):
            return False
        if error is None:
            not_owned = self.NOT_OWNED.match(record.getMessage())
            return not_owned is None or not is_cancelled(not_owned.group(1), quiet=True)
        if self.shut_down and any(self.SHUT_DOWN in str(e) for e in (error, error.__context__) if e):
            return False
        return type(error).__name__ not in self.NAMES
