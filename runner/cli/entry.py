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
import sys
from types import FrameType

from runner.cli.argv import asks_for_json
from runner.cli.signals import ignore_stop_signals, take_stop_signals

INTERRUPTED = 130


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
    take_stop_signals(_interrupt)
    try:
        from runner.cli.main import main

        code = main()
    except KeyboardInterrupt:  # before the command's own handling began, or after it ended
        return _interrupted(argv)
    except SystemExit:  # --help, --version, a usage error: said already
        ignore_stop_signals()
        raise
    ignore_stop_signals()
    return code
