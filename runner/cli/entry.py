"""The ``leanvideo`` console script: :func:`runner.cli.main.main`, with a stop that lands while the
command line is still being imported (its first few tenths of a second: rich, httpx, yaml) ending as
any other Ctrl-C does: ``interrupted``, ``{"error": …}`` on stdout under ``--json``, and exit 130 — not
a traceback from inside an import, nor a death by SIGTERM (143) that a script reading ``--json`` gets
nothing from.

From the first line here to the command's end, SIGINT, SIGTERM and SIGHUP (unless under ``nohup``) raise
:class:`KeyboardInterrupt`, as :func:`runner.cli.signals.stop_signals` has them do inside the command;
once the command has returned its exit code they are ignored, so a stop arriving as the process ends
does not turn a finished command (its files written, its report printed) into exit 143. This module
imports nothing heavy: it must be in place before rich and httpx are.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Collection
from types import FrameType

from runner.cli.argv import asks_for_json
from runner.cli.signals import ignore_stop_signals, take_stop_signals

INTERRUPTED = 130
LINGER_S = 10.0  # how long threads a command left behind get to end once it returned its exit code


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _interrupted(argv: list[str]) -> int:
    ignore_stop_signals()  # a second signal must not cut the message short
    sys.stderr.write("interrupted\n")
    if asks_for_json(argv):
        error = {"type": "KeyboardInterrupt", "message": "interrupted", "exit_code": INTERRUPTED}
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()
    return INTERRUPTED


def run() -> int:
    """Import the command line and run it on ``sys.argv``; the exit code."""
    argv = sys.argv[1:]
    before = set(threading.enumerate())  # the command's own threads are the others
    take_stop_signals(_interrupt)
    try:
        from runner.cli.main import main

        code = main()
    except KeyboardInterrupt:  # before the command's own handling began, or after it ended
        return end(_interrupted(argv), before=before)
    except SystemExit:  # --help, --version, a usage error: said already
        ignore_stop_signals()
        raise
    ignore_stop_signals()
    return end(code, before=before)


def end(code: int, linger_s: float = LINGER_S, before: Collection[threading.Thread] = ()) -> int:
    """``code``, once the threads the command left behind (those not in ``before``) have ended; when
    some have not after ``linger_s`` seconds, the process ends at once with ``code`` (output flushed). A
    batch worker stopped while its database did not answer said "stopped", then hung as long as the
    outage lasted, deaf to Ctrl-C: DBOS's threads still tried to record their jobs (which a worker of
    its id runs again)."""
    deadline = time.monotonic() + linger_s
    while _left(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _left(before):
        return code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _left(before: Collection[threading.Thread]) -> list[threading.Thread]:
    """The threads Python would wait for as it exits, less ``before``: alive, not daemons, not the main
    one."""
    return [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon and thread not in before
    ]
