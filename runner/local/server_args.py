"""ComfyUI flags passed through after ``--``, checked against the ones the runner sets itself: a second
``--port`` or ``--listen`` would make ComfyUI listen where the runner does not look for it, a second
``--output-directory`` would put outputs where the run does not collect them.

Example::

    refuse_owned_flags(("--async-offload",))  # fine
    refuse_owned_flags(("--port", "9000"))    # UsageError: use leanvideo's --port
"""

from __future__ import annotations

from collections.abc import Sequence

from runner.errors import UsageError

# ComfyUI flag -> what to use instead (None: the runner's own folder layout, not configurable)
OWNED_FLAGS: dict[str, str | None] = {
    "--port": "leanvideo's --port",
    "--listen": "`leanvideo serve --host ADDRESS`",
    "--base-directory": None,
    "--output-directory": "the command's --out (demo, bench; a served server keeps them in its folder)",
    "--temp-directory": None,
    "--database-url": None,
    "--extra-model-paths-config": "`leanvideo serve --models DIR`",
}


def refuse_owned_flags(extra_args: Sequence[str]) -> None:
    """Raise :class:`UsageError` naming the first of ``extra_args`` that the runner sets itself
    (``--port 9000`` and ``--port=9000`` alike, and a shortened ``--output-dir``, which ComfyUI's
    argparse takes for ``--output-directory``)."""
    for arg in extra_args:
        flag = _owned_flag(arg.partition("=")[0])
        if flag is None:
            continue
        instead = OWNED_FLAGS[flag]
        advice = f"use {instead} instead" if instead else "it is not configurable"
        raise UsageError(
            f"ComfyUI flag {arg!r} after `--`: leanvideo passes {flag} to ComfyUI itself, and a second one "
            f"would make the two disagree; {advice}"
        )


def _owned_flag(given: str) -> str | None:
    """The owned flag ``given`` is, or stands for as argparse reads a unique start of a long option
    (``--por`` for ``--port``; two letters at least, as no other ComfyUI flag starts so)."""
    if given in OWNED_FLAGS:
        return given
    if not given.startswith("--") or len(given) < 4:
        return None
    matches = [flag for flag in OWNED_FLAGS if flag.startswith(given)]
    return matches[0] if len(matches) == 1 else None
