"""The ``--out`` folder of a command, checked before any work starts and said the same way by every
command: a file where a folder goes, a folder that is not writable, one that cannot be made.

Example::

    check_out_folder(Path("leanvideo-out/demo"))            # made when missing
    check_out_folder(out, create=False, after="; nothing was queued")
"""

from __future__ import annotations

import os
from pathlib import Path

from runner.errors import UsageError


def check_out_folder(out: Path, *, create: bool = True, after: str = "") -> None:
    """Raise :class:`UsageError` (naming ``--out`` and the path at fault, then ``after``) unless ``out``
    is, or can become, a writable folder; with ``create`` it is made (parents too)."""
    there = next((folder for folder in (out, *out.parents) if folder.exists()), None)
    if there is not None and not there.is_dir():
        raise UsageError(f"--out {out}: {there} is a file, not a folder{after}")
    if there is not None and not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: the folder {there} is not writable{after}")
    if not create:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--out {out}: cannot make the folder ({exc.strerror or type(exc).__name__}){after}"
        ) from exc
