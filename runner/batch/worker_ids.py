"""Worker ids: stable across restarts of one command, never shared by two live workers on one machine.

DBOS hands a worker that starts the unfinished jobs recorded under its id: a worker that died is
recovered by starting the same command again. Two workers alive at once under one id would take over
each other's running jobs, and each job would run twice. So a worker holds its id while it runs: an
exclusive lock on a folder named after the id, in the machine's temporary folder, which the operating
system releases when the process ends, however it ends. A second worker asking for a held id is refused.
A folder, not a file: systemd-tmpfiles leaves a folder alone while a BSD lock is held on it (on files it
does so only from systemd 254 on), so a worker that runs for weeks keeps its lock; one deleted before it
was locked is made again.

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

from runner.errors import UsageError, WorkspaceError

logger = logging.getLogger(__name__)

LOCK_FOLDER = "leanvideo-batch-workers"
HOLDER = "holder"  # in a held lock folder: who holds it


def default_worker_id(servers: list[str], batch: str | None = None) -> str:
    """This machine's name and a digest of its servers (and the batch a ``submit --wait`` runs)."""
    digest = hashlib.sha256("\n".join(sorted(servers)).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{digest}" + (f"-{batch}" if batch else "")


@contextlib.contextmanager
def hold_worker_id(worker_id: str, db_url: str = "", lock_dir: Path | None = None) -> Iterator[str]:
    """Hold ``worker_id`` of the queue at ``db_url`` on this machine for the ``with`` block (an id is
    a queue's: workers of two databases may share one). The lock folders live in the machine's temporary
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
    path = folder / digest
    for _ in range(5):  # a lock folder deleted between open and lock is made again
        descriptor = _open_lock(folder, path)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise UsageError(
                f"worker id {worker_id!r} is in use by a live worker on this machine ({_holder(path)}): "
                "each running worker needs its own --worker-id (one that starts under a dead worker's id "
                "takes over that worker's unfinished jobs, which is how a stopped command is resumed)"
            ) from None
        if _still_named(descriptor, path):
            break
        os.close(descriptor)
    else:
        raise WorkspaceError(f"cannot hold the worker id lock {path}: it is deleted as soon as it is made")
    with contextlib.suppress(OSError):  # another user's folder: the lock holds, the note is theirs
        (path / HOLDER).write_text(f"pid {os.getpid()}", encoding="utf-8")
    try:
        yield worker_id
    finally:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def _open_lock(folder: Path, path: Path) -> int:
    """A descriptor of the lock folder ``path``, made (in ``folder``, shared like /tmp) when missing."""
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o1777)  # shared like /tmp: each user's entries stay theirs
        path.mkdir(exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise WorkspaceError(f"cannot make the worker id lock {path}: {exc.strerror or exc}") from exc


def _holder(path: Path) -> str:
    try:
        return (path / HOLDER).read_text(encoding="utf-8").strip() or "another process"
    except OSError:
        return "another process"


def _still_named(descriptor: int, path: Path) -> bool:
    """Whether ``path`` still names the folder locked through ``descriptor``. A cleaner may delete an
    unlocked folder after it was opened: a lock on it would guard nothing, as the next worker makes a
    new one."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
