"""The measured INT8 kernel table on disk: one JSON file, invalidated by a new torch or kernel library.

The file holds a ``fingerprint`` (schema version, torch version, comfy-kitchen version or ``null``) and
``entries``: one :class:`Choice` per shape class key (device, dtype, weight shape, row bucket, weight
layout; see :class:`.dispatch.ShapeClass`). A file whose fingerprint differs from the running one is
ignored and rewritten at the next measurement, so upgrading torch or comfy-kitchen measures again. A
file that cannot be read or parsed is ignored the same way (and the reason logged).

Example::

    entries = load_table(path, current_fingerprint())
    save_table(path, current_fingerprint(), entries)
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

TABLE_SCHEMA = "leanvideo.int8_kernels"
TABLE_VERSION = 3  # bump when a kernel's maths or the measurement changes; 2: int_mm_fused; 3: not on CPUs
KITCHEN_DISTRIBUTION = "comfy-kitchen"


@dataclass(frozen=True)
class Choice:
    """The kernel chosen for one shape class and why.

    ``source`` is ``measured`` (fastest correct kernel at first use), ``forced`` (the ``path`` input
    or ``LEANVIDEO_INT8_KERNEL``) or ``fallback`` (forced kernel cannot run the shape: ``w8a16``).
    ``seconds`` holds each timed kernel's fastest call; ``rejected`` says why a kernel was not a candidate
    (unsupported, error, inaccurate, slower than ``w8a16``).
    """

    kernel: str
    source: str
    seconds: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def ratios(self) -> dict[str, float]:
        """Each timed kernel's time as a multiple of ``w8a16``'s (empty when ``w8a16`` was not timed)."""
        base = self.seconds.get("w8a16")
        return {k: s / base for k, s in self.seconds.items()} if base else {}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Choice:
        return cls(
            kernel=str(data["kernel"]),
            source=str(data["source"]),
            seconds={str(k): float(v) for k, v in data.get("seconds", {}).items()},
            rejected={str(k): str(v) for k, v in data.get("rejected", {}).items()},
        )


def kitchen_version() -> str | None:
    """The installed comfy-kitchen version, or ``None``."""
    try:
        return version(KITCHEN_DISTRIBUTION)
    except PackageNotFoundError:
        return None


def current_fingerprint() -> dict[str, Any]:
    """What a cached table must match to be used: its schema and the torch and kernel-library versions."""
    return {
        "schema": TABLE_SCHEMA,
        "version": TABLE_VERSION,
        "torch": torch.__version__,
        "comfy_kitchen": kitchen_version(),
    }


def load_table(path: Path, fingerprint: dict[str, Any]) -> dict[str, Choice]:
    """The entries of the table at ``path`` when its fingerprint matches ``fingerprint``, else ``{}``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("Ignoring unreadable INT8 kernel table %s: %s", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        old = data.get("fingerprint") if isinstance(data, dict) else None
        logger.info(
            "INT8 kernel table %s was measured with %s, not %s: measuring again", path, old, fingerprint
        )
        return {}
    try:
        return {str(key): Choice.from_dict(entry) for key, entry in data["entries"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        logger.warning("Ignoring malformed INT8 kernel table %s: %s", path, exc)
        return {}


def save_table(path: Path, fingerprint: dict[str, Any], entries: dict[str, Choice]) -> None:
    """Write the table atomically (a reader never sees half a file); failures are logged, not raised."""
    document = {"fingerprint": fingerprint, "entries": {k: c.as_dict() for k, c in sorted(entries.items())}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=1)
        os.replace(temporary, path)
    except OSError as exc:
        logger.warning("Could not write the INT8 kernel table %s: %s", path, exc)
