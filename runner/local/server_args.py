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
    "--output-directory": "the command's --out",
    "--temp-directory": None,
    "--database-url": None,
    "--extra-model-paths-config": "`leanvideo serve --models DIR`",
}


def refuse_owned_flags(extra_args: Sequence[str]) -> None:
    """Raise :class:`UsageError` naming the first of ``extra_args`` that the runner sets itself
    (``--port 9000`` and ``--port=9000`` alike)."""
    for arg in extra_args:
        flag = arg.partition("=")[0]
        if flag not in OWNED_FLAGS:
            continue
        instead = OWNED_FLAGS[flag]
        advice = f"use {instead} instead" if instead else "it is not configurable"
        raise UsageError(
            f"ComfyUI flag {arg!r} after `--`: leanvideo passes {flag} to ComfyUI itself, and a second one "
            f"would make the two disagree; {advice}"
        )
