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
import signal
import sys
from types import FrameType

INTERRUPTED = 130
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _take_stop_signals() -> None:
    for number in _STOP_SIGNALS:
        if number == signal.SIGHUP and signal.getsignal(number) == signal.SIG_IGN:
            continue  # nohup asked for the command to outlive its terminal
        signal.signal(number, _interrupt)


def _ignore_stop_signals() -> None:
    for number in _STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def _interrupted(argv: list[str]) -> int:
    _ignore_stop_signals()  # a second signal must not cut the message short
    sys.stderr.write("interrupted\n")
    own = argv[: argv.index("--")] if "--" in argv else argv  # after "--" come ComfyUI's flags
    if "--json" in own:
        error = {"type": "KeyboardInterrupt", "message": "interrupted", "exit_code": INTERRUPTED}
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()
    return INTERRUPTED


def run() -> int:
    """Import the command line and run it on ``sys.argv``; the exit code."""
    argv = sys.argv[1:]
    _take_stop_signals()
    try:
        from runner.cli.main import main

        code = main()
    except KeyboardInterrupt:  # before the command's own handling began, or after it ended
        return _interrupted(argv)
    except SystemExit:  # --help, --version, a usage error: said already
        _ignore_stop_signals()
        raise
    _ignore_stop_signals()
    return code
