"""A command line read before argparse reads it: which command it runs, and whether it asks for JSON.
Standard library only, so that the console script can tell before the rest of the CLI has imported.

Example::

    command_of(["-v", "run", "wf.json"])    # "run"
    asks_for_json(["run", "wf.json", "--js"])  # True: argparse takes a unique start of an option
"""

from __future__ import annotations


def command_of(args: list[str]) -> str | None:
    """The command word of a command line: the first argument that is not an option."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def asks_for_json(args: list[str]) -> bool:
    """Whether ``--json`` is given, also abbreviated as argparse takes it (``--js``); what follows a
    ``--`` is not an option."""
    own = args[: args.index("--")] if "--" in args else args
    return any(len(arg) >= 4 and "--json".startswith(arg) for arg in own)
