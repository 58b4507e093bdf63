"""A server's ``comfyui.log``: its last lines for an error message, what they say went wrong (a missing
package, built-in nodes or custom node packs that did not import, the node pack's warnings), and the
previous server's log kept when a new one starts in the same folder.

Example::

    keep_previous_log(state_dir / "comfyui.log")  # comfyui.log → comfyui.log.1
    print(read_log_tail(state_dir / "comfyui.log"))
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "LOG_TAIL_LINES",
    "custom_node_failures",
    "custom_nodes_warning",
    "import_failures",
    "keep_previous_log",
    "missing_nodes_warning",
    "missing_package_hint",
    "pack_warnings",
    "read_log",
    "read_log_tail",
    "start_warnings",
]

LOG_TAIL_LINES = 40


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or a note that there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def keep_previous_log(log: Path) -> None:
    """The log of the server that ran here before (a crash's cause, say) becomes ``comfyui.log.1``,
    replacing the one before it, instead of being cut to nothing by the new server's start."""
    try:
        if log.stat().st_size:
            os.replace(log, log.with_name(log.name + ".1"))
    except OSError:  # no log yet, or one that cannot be moved: the new server starts anyway
        pass


def read_log(path: Path) -> str:
    """The text of the log ``path``; ``""`` when there is none (or it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def start_warnings(path: Path, python: Path, server: str) -> list[str]:
    """The warnings about ``server`` (``ComfyUI on port 8188``), which started and answers, in its log
    ``path``, read once: built-in nodes that did not import, custom node packs that did not (``python``
    is the interpreter it runs), and the node pack's own start-up warnings (``…: LeanVideo: …``)."""
    text = read_log(path)
    said = [missing_nodes_warning(text, path), custom_nodes_warning(text, python)]
    return [f"{server} {warning}" for warning in said if warning is not None] + [
        f"{server}: {warning}" for warning in pack_warnings(text)
    ]


def import_failures(log: str) -> list[str]:
    """The built-in node files the ComfyUI log text ``log`` says did not import (``IMPORT FAILED:
    nodes_lt.py``): a damaged or incomplete ComfyUI, or a dependency missing since it was installed."""
    return [
        line.split("IMPORT FAILED:", 1)[1].strip() for line in log.splitlines() if "IMPORT FAILED:" in line
    ]


def missing_nodes_warning(log: str, path: Path) -> str | None:
    """What to say of a server that started without some of its built-in nodes (its log text ``log``,
    read from ``path``, names them), or None when every one imported."""
    failed = import_failures(log)
    if not failed:
        return None
    return (
        f"started without its nodes from {', '.join(failed)} (IMPORT FAILED in {path}): "
        "`python3 install.py` checks its files against the pin and its packages"
    )


def custom_node_failures(log: str) -> dict[str, str]:
    """The custom node packs the ComfyUI log text ``log`` says did not import (``Cannot import
    /…/custom_nodes/pack module for custom nodes: No module named 'x'``): their folder -> the error."""
    marker, separator = "Cannot import ", " module for custom nodes: "
    failed: dict[str, str] = {}
    for line in log.splitlines():
        start = line.find(marker)
        if start >= 0 and separator in line[start:]:
            folder, error = line[start + len(marker) :].split(separator, 1)
            if not Path(folder).name.startswith("."):  # a tool's cache (.mypy_cache), never a pack
                failed[folder] = error.strip()
    return failed


def custom_nodes_warning(log: str, python: Path) -> str | None:
    """What to say of a server whose log text ``log`` names custom node packs that did not import (their
    nodes are missing from it), or None when every one imported; ``python`` is the interpreter it runs."""
    failed = custom_node_failures(log)
    if not failed:
        return None
    packs = "; ".join(f"{Path(folder).name} ({error})" for folder, error in failed.items())
    listed = [Path(folder) / "requirements.txt" for folder in failed]
    listed = [file for file in listed if file.is_file()]  # a pack without one says in its README
    how = " ".join(f"-r {file}" for file in listed)
    fix = f" (`{python} -m pip install {how}`)" if listed else ""
    return (
        f"started without the custom nodes that did not import: {packs}. It runs under {python}: "
        f"install what they need into that Python{fix}"
    )


PACK_SAYS = "LeanVideo: "  # how the node pack's start-up warnings to its user begin


def pack_warnings(log: str) -> list[str]:
    """What the node pack told its user in the ComfyUI log text ``log`` as the server started (a second
    copy of it left unloaded, node ids another pack took, a ``LEANVIDEO_INT8_KERNEL`` that names no
    kernel): each such line from ``LeanVideo:`` on."""
    return [line[line.find(PACK_SAYS) :] for line in log.splitlines() if PACK_SAYS in line]


def missing_package_hint(tail: str, python: Path) -> str:
    """The fix to add to a start-up failure whose log ``tail`` ends in a missing module, else ``""``."""
    if "ModuleNotFoundError" not in tail:
        return ""
    fix = "run `python3 install.py` (it installs what is missing)"
    return f"\nA package ComfyUI imports is missing from {python}: {fix}"
