"""The ``leanvideo`` console script: :func:`runner.cli.main.main`, with a Ctrl-C that lands while the
command line is still being imported (its first few tenths of a second: rich, httpx, yaml) ending as
any other Ctrl-C does: ``interrupted`` and exit 130, not a traceback from inside an import."""

from __future__ import annotations

import sys

INTERRUPTED = 130


def run() -> int:
    """Import the command line and run it on ``sys.argv``; the exit code."""
    try:
        from runner.cli.main import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return INTERRUPTED
    return main()
