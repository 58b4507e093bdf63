"""A new model file beside the user's files: written under a hidden name of its own, moved into place
only where nothing has appeared meanwhile, never replacing anything.

The hidden name says who writes it: ``.NAME.<host>-<pid>.<hex>.partial``. A writer killed with SIGKILL
(or a power cut) leaves its file behind, as large as the model; the next writer of the same target on
the same host removes it once that process is gone.

Example::

    check_target(target)
    removed = remove_dead_partials(target)
    partial = new_partial(target)
    try:
        write(partial)
        move_without_overwriting(partial, target)
    finally:
        partial.unlink(missing_ok=True)
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

__all__ = ["check_target", "move_without_overwriting", "new_partial", "remove_dead_partials"]


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


def new_partial(target: Path) -> Path:
    """A new empty file of our own beside ``target``, with the permissions the umask gives any new file
    (``mkstemp`` makes it 0600: a ComfyUI server running as another user could not read the model)."""
    owner = f"{_host()}-{os.getpid()}"
    while True:
        path = target.parent / f".{target.name}.{owner}.{secrets.token_hex(4)}.partial"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_dead_partials(target: Path) -> list[Path]:
    """Remove the hidden files that writers of ``target`` on this host left when they were killed (their
    process is gone); returns them. Another host's, a live writer's and an unknown writer's stay."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(?P<host>.+)-(?P<pid>\d+)\.[0-9a-f]{{8}}\.partial")
    removed = []
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except OSError:
        return []
    for name in names:
        found = pattern.fullmatch(name)
        if found is None or found["host"] != _host():
            continue
        pid = int(found["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        path = target.parent / name
        try:
            path.unlink()
        except FileNotFoundError:  # its writer's successor got there first
            continue
        removed.append(path)
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
