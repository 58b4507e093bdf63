"""Worker ids: stable across restarts of one command, never shared by two live workers on one machine.

DBOS hands a worker that starts the unfinished jobs recorded under its id: a worker that died is
recovered by starting the same command again. Two workers alive at once under one id would take over
each other's running jobs, and each job would run twice. So a worker holds its id while it runs: an
exclusive lock on a file named after the id, in the machine's temporary folder, which the operating
system releases when the process ends, however it ends. A second worker asking for a held id is refused.
systemd-tmpfiles does not age a file while a BSD lock is held on it, so a worker that runs for weeks keeps
its lock file; one deleted before it was locked is made again.

The default id is this machine's name and a digest of the ``--server`` list; ``batch submit --wait``
adds the batch's name, so two batches submitted at once on the same servers run side by side.

Example::

    with hold_worker_id(default_worker_id(["http://127.0.0.1:8188"], batch="nightly")) as worker_id:
        ...  # launch DBOS with executor_id=worker_id
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from runner.errors import UsageError, WorkspaceError

logger = logging.getLogger(__name__)

LOCK_FOLDER = "leanvideo-batch-workers"


def default_worker_id(servers: list[str], batch: str | None = None) -> str:
    """This machine's name and a digest of its servers (and the batch a ``submit --wait`` runs)."""
    digest = hashlib.sha256("\n".join(sorted(servers)).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{digest}" + (f"-{batch}" if batch else "")


@contextlib.contextmanager
def hold_worker_id(worker_id: str, db_url: str = "", lock_dir: Path | None = None) -> Iterator[str]:
    """Hold ``worker_id`` of the queue at ``db_url`` on this machine for the ``with`` block (an id is
    a queue's: workers of two databases may share one). The lock files live in the machine's temporary
    folder, writable by every user (one user's lock must not make another's worker fail).

    Raises:
        UsageError: another live process on this machine holds it (its pid is named).
        WorkspaceError: the lock file cannot be made (named).
    """
    try:
        import fcntl
    except ImportError:  # not a POSIX system: nothing to hold the id with
        logger.warning(
            "worker id %s is not guarded on this system: give each worker its own --worker-id", worker_id
        )
        yield worker_id
        return
    folder = lock_dir or Path(tempfile.gettempdir()) / LOCK_FOLDER
    digest = hashlib.sha256("\n".join((db_url, worker_id)).encode()).hexdigest()[:16]
    path = folder / f"{digest}.lock"
    for _ in range(5):  # a lock file deleted between open and lock is made again
        handle = _open_lock(folder, path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read().strip() or "another process"
            handle.close()
            raise UsageError(
                f"worker id {worker_id!r} is in use by a live worker on this machine ({holder}): each "
                "running worker needs its own --worker-id (one that starts under a dead worker's id takes "
                "over that worker's unfinished jobs, which is how a stopped command is resumed)"
            ) from None
        if _still_named(handle, path):
            break
        handle.close()
    else:
        raise WorkspaceError(f"cannot hold the worker id lock {path}: it is deleted as soon as it is made")
    with handle:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield worker_id
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open_lock(folder: Path, path: Path) -> IO[str]:
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o1777)  # shared like /tmp: each user's files stay theirs
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise WorkspaceError(f"cannot make the worker id lock {path}: {exc.strerror or exc}") from exc
    return os.fdopen(descriptor, "r+", encoding="utf-8")


def _still_named(handle: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the file locked through ``handle``. A cleaner may delete an unlocked
    file after it was opened: a lock on it would guard nothing, as the next worker makes a new file."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
