"""The server's process group: tied to the process that started it, and stopped as a whole.

Example::

    subprocess.Popen(command, start_new_session=True, preexec_fn=die_with_parent)
    terminate_process_group(process.pid, 10.0, process.poll, process.wait)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Callable

logger = logging.getLogger(__name__)


def die_with_parent() -> None:
    """Ask Linux to SIGTERM the child when the process that started it dies (no orphans)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def terminate_process_group(
    pid: int,
    timeout: float,
    poll: Callable[[], int | None],
    wait: Callable[[float], int],
) -> int | None:
    """SIGTERM the group led by ``pid``; SIGKILL it if it is still alive after ``timeout`` seconds."""
    for sig, grace in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        try:
            return wait(grace)
        except subprocess.TimeoutExpired:
            logger.warning("ComfyUI (pid %d) ignored %s", pid, sig.name)
    # Reap anything left in the group (children that outlived the leader).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return poll()
