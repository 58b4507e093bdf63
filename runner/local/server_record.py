"""A started server's record, ``server.json`` in its state folder: written once it answers, removed when
it stops, and read by ``leanvideo stop`` (:mod:`runner.local.background`) to find a background server.

Example::

    write_record(state_dir, {"pid": 4242, "port": 8188, "background": True})
    remove_own_record(state_dir, 4242)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["RECORD_NAME", "remove_own_record", "write_record"]

RECORD_NAME = "server.json"


def write_record(state_dir: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as the server record of ``state_dir``."""
    (state_dir / RECORD_NAME).write_text(json.dumps(record, indent=2), encoding="utf-8")


def remove_own_record(state_dir: Path, pid: int) -> None:
    """Remove the record of ``state_dir`` when it is the server ``pid``'s: a start that lost the port to
    another server starting at the same moment leaves that one's record."""
    record = state_dir / RECORD_NAME
    try:
        if json.loads(record.read_text(encoding="utf-8")).get("pid") == pid:
            record.unlink()
    except (OSError, ValueError, AttributeError):
        pass
