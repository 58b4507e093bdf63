"""Exceptions raised by the LeanVideo runner library.

Every error the library raises on purpose derives from :class:`LeanVideoError`; the CLI maps each
branch of the tree to its own exit code so scripts can tell failures apart::

    LeanVideoError                  exit 1
    ├── WorkspaceError              exit 3   ComfyUI or the venv is missing: run install.py
    ├── ServerError                 exit 4
    │   ├── PortInUseError                   the port is already bound
    │   ├── ServerCrashedError               the process exited during start-up
    │   └── ServerTimeoutError               no answer from /system_stats in time
    ├── WorkflowError               exit 5   a workflow file is missing, malformed or rejected
    └── PromptFailedError           exit 6   the server ran the prompt and reported an error
"""

from __future__ import annotations


class LeanVideoError(Exception):
    """Base class for every error the runner raises on purpose."""

    exit_code = 1


class WorkspaceError(LeanVideoError):
    """The pinned ComfyUI or the environment it needs is missing or unusable."""

    exit_code = 3


class ServerError(LeanVideoError):
    """A ComfyUI server could not be started, reached or stopped."""

    exit_code = 4


class PortInUseError(ServerError):
    """The requested port is already bound by another process."""


class ServerCrashedError(ServerError):
    """The server process exited before it became ready."""


class ServerTimeoutError(ServerError):
    """The server did not answer ``GET /system_stats`` within the timeout."""


class WorkflowError(LeanVideoError):
    """A workflow file is missing, malformed, or was rejected by the server's validation."""

    exit_code = 5


class PromptFailedError(LeanVideoError):
    """The server accepted the prompt but its execution failed or was interrupted."""

    exit_code = 6
