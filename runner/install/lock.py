"""One install at a time per checkout (standard library only, like ``install.py``).

Two ``install.py`` runs at once on one checkout (two terminals, a CI step beside a user's run) built one
venv and one ComfyUI folder together, and one of them failed half-way with a bare
``[Errno 39] Directory not empty``. The second now waits for the first, saying so, and then finds what
the first put in place. The lock is ``flock`` on a file in the checkout: the kernel releases it when
its holder dies, however it dies, so a killed install never blocks the next. Where there is no
``fcntl`` (Windows) or the file cannot be made (a read-only checkout, which cannot hold a venv
either), there is no lock.

Example::

    with install_lock(Path(".install.lock")):
        ...  # the venv, ComfyUI, install.json
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from runner.install.comfy import say

LOCK_NAME = ".install.lock"


@contextlib.contextmanager
def install_lock(path: Path) -> Iterator[None]:
    """Hold the install lock ``path`` for the block; when another install holds it, say which and wait
    (Ctrl-C stops the wait)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only checkout: the install fails where it writes, and says so there
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            say(f"another install.py is running on this checkout (pid {holder}); waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
            say("the other install.py ended; checking what it put in place")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
