"""One server at a time in a state folder: an exclusive lock on ``server.lock`` in it, taken before the
server's start touches anything there and held by the server process itself (it inherits the locked
file), so it lasts exactly as long as that server, also one started in the background by a command
that has ended. Without it two ``serve`` on one port, started at the same moment, shared the folder:
the loser's start moved the winner's ``comfyui.log`` aside and wrote its own over it.

Example::

    fd = lock_state_dir(state_dir, port=8188)  # PortInUseError when another server holds it
    process = subprocess.Popen(command, pass_fds=(fd,))
    note_holder(fd, process.pid)
    os.close(fd)  # the server holds the lock now
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from runner.errors import PortInUseError

LOCK_NAME = "server.lock"


def lock_state_dir(state_dir: Path, *, port: int) -> int:
    """A file descriptor holding ``state_dir``'s lock; pass it to the server process, then close it.

    Raises:
        PortInUseError: another server is starting or running in ``state_dir`` (naming its pid).
    """
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        who = f"ComfyUI (pid {holder})" if holder else "another ComfyUI"
        raise PortInUseError(
            f"{who} is already starting or running in {state_dir} (port {port}): stop it first "
            f"(`leanvideo stop --port {port}` if it runs in the background) or pass another --port"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def note_holder(fd: int, pid: int) -> None:
    """Write the server's ``pid`` into the lock file, for the message of a start it refuses."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{pid}\n".encode(), 0)


def _holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None
