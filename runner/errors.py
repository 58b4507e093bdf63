"""Exceptions raised by the LeanVideo runner library.

Every error the library raises on purpose derives from :class:`LeanVideoError`; the CLI maps each
branch of the tree to its own exit code so scripts can tell failures apart::

    LeanVideoError                  exit 1
    ├── OutputWriteError            exit 1   a file could not be written (disk full, read-only): named
    ├── UsageError                  exit 2   an argument or setting cannot be used (also a ValueError)
    ├── WorkspaceError              exit 3   ComfyUI or the venv is missing: run install.py
    ├── ServerError                 exit 4
    │   ├── PortInUseError          exit 2   the port asked for is already bound (a UsageError too)
    │   ├── ServerCrashedError               the process exited during start-up
    │   ├── ServerTimeoutError               no answer from /system_stats in time
    │   ├── ServerUnreachableError           the server vanished mid-run and did not come back in time
    │   └── PromptLostError                  the server no longer knows our prompt (it restarted)
    ├── WorkflowError               exit 5   a workflow file is missing, malformed or rejected
    └── PromptFailedError           exit 6   the server ran the prompt and reported an error
        ├── PromptTimeoutError      exit 7   the prompt did not finish in time (it was interrupted)
        └── PromptCancelledError    exit 130 the user pressed Ctrl-C (the prompt was interrupted)

A :class:`PromptFailedError` carries the partial :class:`~runner.transport.client.PromptResult` in ``result``
when there is one, so callers can still write a (partial) run record.
"""

from __future__ import annotations

from typing import Any


class LeanVideoError(Exception):
    """Base class for every error the runner raises on purpose.

    ``result`` holds the partial prompt result when a run got that far, ``record_path`` the partial
    run record written for it.
    """

    exit_code = 1
    result: Any = None
    record_path: Any = None


class OutputWriteError(LeanVideoError):
    """An output file or record could not be written (the disk is full, the folder turned read-only):
    the message names the file, and nothing half-written is left under its name."""


class UsageError(LeanVideoError, ValueError):
    """An argument names something that cannot be used: an output folder that is a file or not writable,
    a port out of range, a settings value out of its range (``RunOptions(timeout=0)``). Raised before any
    work starts; a :class:`ValueError` too, as settings checks are."""

    exit_code = 2


class WorkspaceError(LeanVideoError):
    """The pinned ComfyUI or the environment it needs is missing or unusable."""

    exit_code = 3


class ServerError(LeanVideoError):
    """A ComfyUI server could not be started, reached or stopped. ``status``: the HTTP status it (or a
    proxy in front of it) answered, when the error is an answer."""

    exit_code = 4

    def __init__(self, *args: object, status: int | None = None) -> None:
        super().__init__(*args)
        self.status = status


class PortInUseError(UsageError, ServerError):
    """The requested port is already bound by another process: a ``--port`` that cannot be used (exit 2),
    and still a server that could not start for whoever catches :class:`ServerError`."""


class ServerCrashedError(ServerError):
    """The server process exited before it became ready."""


class ServerTimeoutError(ServerError):
    """The server did not answer ``GET /system_stats`` within the timeout."""


class ServerUnreachableError(ServerError):
    """The server stopped answering during a run and did not come back before the deadline."""


class PromptLostError(ServerError):
    """Neither ``/history`` nor ``/queue`` knows the prompt any more: the server restarted under it."""


class WorkflowError(LeanVideoError):
    """A workflow file is missing, malformed, or was rejected by the server's validation."""

    exit_code = 5


class PromptFailedError(LeanVideoError):
    """The server accepted the prompt but its execution failed or was interrupted."""

    exit_code = 6

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class PromptTimeoutError(PromptFailedError):
    """The prompt did not finish before the timeout; the client interrupted it on the server."""

    exit_code = 7


class PromptCancelledError(PromptFailedError):
    """The user cancelled the run (Ctrl-C); the prompt was interrupted and removed from the queue."""

    exit_code = 130
