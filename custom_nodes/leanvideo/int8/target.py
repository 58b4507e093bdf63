"""A new model file beside the user's files: written under a hidden name of its own, moved into place
only where nothing has appeared meanwhile, never replacing anything.

The hidden name says who writes it, ``.NAME.<host>-<pid>.<hex>.partial``, and its writer holds a lock on
it (``flock``) until it ends. A writer killed with SIGKILL (or a power cut) leaves its file behind, as
large as the model, and its lock goes with it: the next writer of the same target removes every such
file it can lock. One that is locked belongs to a live writer, on this machine or another (a process
in another PID namespace, a host sharing the folder), and stays.

Example::

    check_target(target)
    removed = remove_dead_partials(target)
    with new_partial(target) as partial:
        write(partial)
        move_without_overwriting(partial, target)
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; leftovers are left for the user to remove
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "TargetFolderError",
    "check_target",
    "move_without_overwriting",
    "new_partial",
    "remove_dead_partials",
]


class TargetFolderError(OSError):
    """The folder of a new file cannot take it: said naming the file asked for, not the hidden one."""


def check_target(target: Path) -> None:
    """Refuse a ``target`` that exists, is a link or a folder, or whose folder cannot take it."""
    if target.is_dir():
        raise IsADirectoryError(
            f"{target} is a folder; name the new file, e.g. {target / 'model-int8.safetensors'}"
        )
    if target.exists():
        raise FileExistsError(f"{target} exists; refusing to overwrite it")
    if target.is_symlink():
        raise FileExistsError(f"{target} is a link (to {os.readlink(target)}); refusing to write through it")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{target}: the folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{target}: cannot write in the folder {target.parent} (permission denied)")


def _host() -> str:
    return socket.gethostname() or "localhost"


@contextlib.contextmanager
def new_partial(target: Path) -> Iterator[Path]:
    """A new empty file of our own beside ``target``, locked while the block runs and removed after it
    (once moved into place, the target keeps the data). It gets the permissions the umask gives any new
    file (``mkstemp`` makes it 0600: a ComfyUI server running as another user could not read the model)."""
    owner = f"{_host()}-{os.getpid()}"
    while True:
        path = target.parent / f".{target.name}.{owner}.{secrets.token_hex(4)}.partial"
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as error:  # /proc, a read-only mount that access() let through
            raise TargetFolderError(
                f"{target}: cannot write in the folder {target.parent} ({error.strerror or error})"
            ) from error
        break
    try:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(handle)


def remove_dead_partials(target: Path) -> list[Path]:
    """Remove the hidden files that writers of ``target`` left when they were killed (no one holds their
    lock any more); returns them. A locked one, a file of another name and, without ``flock``, every
    one stays."""
    if fcntl is None:
        return []
    pattern = re.compile(rf"\.{re.escape(target.name)}\..+-\d+\.[0-9a-f]{{8}}\.partial")
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except OSError:
        return []
    removed = []
    for name in names:
        if pattern.fullmatch(name) is None:
            continue
        path = target.parent / name
        try:
            handle = os.open(path, os.O_RDONLY)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # locked: its writer is alive
            os.close(handle)
            continue
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(handle)
    return removed


def move_without_overwriting(partial: Path, target: Path) -> None:
    """``partial`` becomes ``target``, unless ``target`` appeared since the start (then it is kept)."""
    appeared = f"{target} appeared while quantizing; refusing to overwrite it"
    try:
        os.link(partial, target)  # fails when target exists: nothing is ever replaced
    except FileExistsError as exc:
        raise FileExistsError(appeared) from exc
    except OSError:  # a file system without hard links: check, then rename
        if target.exists():
            raise FileExistsError(appeared) from None
        os.replace(partial, target)
