"""The ``--out`` folder of a command, checked before any work starts and said the same way by every
command: a file where a folder goes, a folder that is not writable, one that cannot be made.

Example::

    made = check_out_folder(Path("leanvideo-out/demo"))     # made when missing
    check_out_folder(out, create=False, after="; nothing was queued")
    remove_empty_folders(made)                              # the command failed before writing there
"""

from __future__ import annotations

import os
from pathlib import Path

from runner.errors import UsageError


def check_out_folder(out: Path, *, create: bool = True, after: str = "") -> list[Path]:
    """Raise :class:`UsageError` (naming ``--out`` and the path at fault, then ``after``) unless ``out``
    is, or can become, a writable folder; with ``create`` it is made (parents too). Returns the folders
    it made, deepest first."""
    there = next((folder for folder in (out, *out.parents) if folder.exists()), None)
    if there is not None and not there.is_dir():
        raise UsageError(f"--out {out}: {there} is a file, not a folder{after}")
    if there is not None and not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: the folder {there} is not writable{after}")
    if not create:
        return []
    made = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--out {out}: cannot make the folder ({exc.strerror or type(exc).__name__}){after}"
        ) from exc
    return made


def remove_empty_folders(made: list[Path]) -> None:
    """Remove the folders ``check_out_folder`` made (deepest first) as long as they are empty: a command
    that failed before writing anything leaves no empty ``--out`` behind; one with files stays."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): what is there is the user's
            return
