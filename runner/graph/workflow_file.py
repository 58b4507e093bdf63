"""Reading a workflow file: JSON text (UTF-8), standard input (``-``), or a PNG image ComfyUI saved
(the workflow written into it); with an error naming the file for anything else: another image or a
video, a LeanVideo record, text that is not JSON.

Example::

    document = read_json_file(Path("output/ComfyUI_00001_.png"))  # the API workflow that made it
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path
from typing import Any

from runner.errors import WorkflowError
from runner.graph.png_workflow import PNG_SIGNATURE, WORKFLOW_KEYS, png_workflow_text

__all__ = ["read_json_file", "refuse_constant", "refuse_duplicate_keys"]

# What else users give as a workflow: the media ComfyUI writes, by their first bytes
MEDIA = {
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"\x1a\x45\xdf\xa3": "a WebM/Matroska video",
}


def read_json_file(path: Path, what: str = "workflow file", png_keys: tuple[str, ...] = WORKFLOW_KEYS) -> Any:
    """The JSON in ``path`` (UTF-8, a byte-order mark allowed; ``-``: standard input; a PNG image ComfyUI
    saved: the first of its ``png_keys`` texts, the API workflow that ran before the editor's graph),
    with an error that names the file when it is missing, not a file, empty, not UTF-8 or not JSON,
    another image or a video, or a LeanVideo record. ``NaN`` and ``Infinity`` are refused: ComfyUI
    cannot receive them."""
    name = "standard input" if str(path) == "-" else str(path)
    where = ""
    if str(path) == "-" and (sys.stdin is None or sys.stdin.isatty()):
        state = "closed" if sys.stdin is None else "a terminal"
        raise WorkflowError(f"{what} - (standard input): it is {state}; pipe the workflow into it")
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
        if raw.startswith(PNG_SIGNATURE):  # an image ComfyUI saved holds the workflow that made it
            key, text = _png_text(raw, name, what, png_keys)
            where = f" (its PNG text {key!r})"
        else:
            _refuse_media(raw, name, what)
            text = raw.decode("utf-8-sig")
    except FileNotFoundError as exc:
        raise WorkflowError(f"{what} {name} does not exist") from exc
    except IsADirectoryError as exc:
        raise WorkflowError(f"{what} {name} is a folder, not a file") from exc
    except UnicodeDecodeError as exc:
        raise WorkflowError(f"{what} {name} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    except OSError as exc:
        raise WorkflowError(f"{what} {name} cannot be read: {exc.strerror or exc}") from exc
    if not text.strip():
        raise WorkflowError(f"{what} {name} is empty")
    try:
        document = json.loads(text, parse_constant=refuse_constant, object_pairs_hook=refuse_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise WorkflowError(f"{what} {name}{where} is not valid JSON: {exc}") from exc
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's guard against huge numbers
            raise WorkflowError(
                f"{what} {name}{where} holds a number of over 4300 digits, which no input takes"
            ) from exc
        raise WorkflowError(f"{what} {name}{where}: {exc}") from exc
    except RecursionError as exc:
        raise WorkflowError(f"{what} {name} is not a workflow: its JSON is nested too deeply") from exc
    _refuse_record(document, name, what)
    return document


def _png_text(raw: bytes, name: str, what: str, keys: tuple[str, ...]) -> tuple[str, str]:
    try:
        found = png_workflow_text(raw, keys)
    except (ValueError, zlib.error) as exc:
        raise WorkflowError(f"{what} {name} is a PNG image that cannot be read ({exc})") from exc
    if found is None:
        texts = " or ".join(repr(key) for key in keys)
        raise WorkflowError(f"{what} {name} is a PNG image with no ComfyUI workflow in it (no {texts} text)")
    return found


def _refuse_media(raw: bytes, name: str, what: str) -> None:
    """A workflow file that is an image or a video ComfyUI does not write workflows into here."""
    kind = next((kind for start, kind in MEDIA.items() if raw.startswith(start)), None)
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        kind = "a WebP image"
    elif raw[4:8] == b"ftyp":
        kind = "an MP4/MOV video"
    if kind is not None:
        raise WorkflowError(
            f"{what} {name} is {kind}, not a workflow: give the workflow file (the editor's Save or "
            "Export (API)), or a PNG image ComfyUI saved, which holds it"
        )


def _refuse_record(document: Any, name: str, what: str) -> None:
    """A LeanVideo record (a run's ``run.json``, a bench's ``bench.json``) given as a workflow."""
    schema = document.get("schema") if isinstance(document, dict) else None
    if what == "workflow file" and isinstance(schema, str) and schema.startswith("leanvideo."):
        workflow = document.get("workflow")
        ran = workflow.get("path") if isinstance(workflow, dict) else None
        it_ran = (
            ""
            if not ran
            else "; it ran a workflow from standard input"
            if ran == "-"
            else f"; the workflow it ran: {ran}"
        )
        raise WorkflowError(f"{what} {name} is a LeanVideo record ({schema}), not a workflow{it_ran}")


def refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``json.loads`` ``object_pairs_hook``: an object with a key given twice is a :class:`ValueError`."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(
                f"key {key!r} appears twice in one object (JSON keeps only the last, so one of the two "
                "would be dropped without a word): keep one"
            )
        found[key] = value
    return found


def refuse_constant(name: str) -> Any:
    """A ``json.loads`` ``parse_constant``: ``NaN`` and ``Infinity`` are refused, naming them."""
    raise ValueError(f"{name} is not a JSON number (ComfyUI cannot receive it); write a finite number")
