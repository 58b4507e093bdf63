"""How a command is stopped from outside: Ctrl-C, ``kill -INT``, SIGTERM (``timeout``, CI runners,
docker, systemd, Kubernetes) and SIGHUP (a closed terminal or ssh session, unless under ``nohup``) all
take Ctrl-C's path.

Without this, SIGTERM killed a command on the spot: ``run`` left its prompt computing on the server and
an empty run folder, ``quantize`` and ``fixtures`` their hidden ``.partial`` files, and ``serve
--background`` killed during start-up a server no ``stop`` could find. A command started in the
background by a script inherits SIGINT ignored, so ``kill -INT`` did nothing. Under
:func:`stop_signals` both signals raise :class:`KeyboardInterrupt`, whose handlers cancel the prompt,
write the partial record and remove partial files; a repeat within ``grace_s`` of the first is ignored,
so a second Ctrl-C does not cut that cleaning up short (one after it stops the cleaning up too).
``batch submit --wait`` and ``batch worker`` keep handlers of their own inside (``runner/cli/batch.py``),
under which every signal raises.

Example::

    with stop_signals():
        return run_command(args)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal or ssh went away
CLEANUP_GRACE_S = 10.0


def take_stop_signals(handler: Callable[[int, FrameType | None], None]) -> None:
    """Point SIGINT, SIGTERM and SIGHUP at ``handler``; SIGHUP stays ignored when it is (``nohup`` asked
    for the command to outlive its terminal)."""
    for number in STOP_SIGNALS:
        if number == signal.SIGHUP and signal.getsignal(number) == signal.SIG_IGN:
            continue
        signal.signal(number, handler)


def ignore_stop_signals() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP: the command is ending, and a late one must not change how."""
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


@contextmanager
def stop_signals(grace_s: float = CLEANUP_GRACE_S) -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`KeyboardInterrupt` inside the block (see the module docstring);
    the previous handlers come back after it, unless a signal stopped the block: then both stay ignored
    while the process ends. Outside the main thread (where Python cannot set handlers) it changes
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if first and now - first[0] < grace_s:  # the first one's cleaning up is under way: let it finish
            os.write(2, b"still stopping (cancelling, removing partial files); a moment\n")
            return
        first[:] = [now]
        raise KeyboardInterrupt

    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    take_stop_signals(interrupt)
    try:
        yield
    finally:
        for number, handler in previous.items():
            # Once stopped by a signal the command is ending: a repeat arriving between here and the
            # exit must not turn a clean exit 130 into a death by signal.
            signal.signal(number, signal.SIG_IGN if first else handler)
