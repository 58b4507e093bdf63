"""The INT8 kernel tables that servers measured (``<user dir>/leanvideo/int8_kernels.json``): find them,
read them as the dispatcher would, and clear them so that the next load measures again.

``path=auto`` in the INT8 loaders times each kernel on each layer shape at first use and keeps the
fastest in that table. A table measured while the machine was busy can keep a poor choice; a table
from another torch or comfy-kitchen is ignored by the dispatcher (``current`` is False here).

Example::

    for table in read_tables(find_tables([workspace.servers_dir])):
        print(table.path, table.current, len(table.rows))
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leanvideo.int8.kernel_table import TABLE_SCHEMA, Choice, ShapeClass, current_fingerprint
from leanvideo.int8.linear import KERNELS

from runner.errors import LeanVideoError
from runner.graph.ui_shape import json_kind

TABLE_NAME = "int8_kernels.json"


@dataclass(frozen=True)
class KernelRow:
    """One shape class of a table and the choice made for it."""

    shape: ShapeClass
    choice: Choice

    def to_json(self) -> dict[str, Any]:
        ratios = {name: round(value, 4) for name, value in self.choice.ratios().items()}
        return {
            "device": self.shape.device,
            "dtype": self.shape.dtype,
            "shape": self.shape.weight_shape,
            "rows": str(self.shape.rows),
            "layout": self.shape.layout,
            "kernel": self.choice.kernel,
            "source": self.choice.source,
            "ratio_to_w8a16": ratios,
            "rejected": self.choice.rejected,
        }


@dataclass(frozen=True)
class KernelTable:
    """A table file: the versions it was measured with, whether the running ones match, its rows."""

    path: Path
    fingerprint: dict[str, Any]
    current: bool
    rows: tuple[KernelRow, ...]

    def stale_because(self) -> list[str]:
        """What differs from what runs here (``table format 3, now 2``; ``torch 2.0.0, now 2.14.1``):
        why servers measure again; empty for a table in use."""
        now = current_fingerprint()
        labels = {
            "schema": "schema",
            "version": "table format",
            "torch": "torch",
            "comfy_kitchen": "comfy-kitchen",
        }
        return [
            f"{label} {self.fingerprint.get(key)}, now {now.get(key)}"
            for key, label in labels.items()
            if self.fingerprint.get(key) != now.get(key)
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "fingerprint": self.fingerprint,
            "current": self.current,
            "rows": [row.to_json() for row in self.rows],
        }


BENCH_TABLE = "a result of int8_bench.py (each kernel's time per shape), not a server's kernel table"
BENCH_SCHEMA = "leanvideo.int8_bench"


def find_tables(places: Iterable[Path]) -> list[Path]:
    """Every table file among ``places``: a file is taken as it is, a folder is searched (recursively)."""
    found: list[Path] = []
    for place in places:
        if place.is_file():
            found.append(place)
        elif place.is_dir():  # int8_bench's --json tables share the name: they are not searched for
            found += sorted(path for path in place.rglob(TABLE_NAME) if not _is_bench_table(path))
        else:
            raise LeanVideoError(f"{place}: no such file or folder")
    return list(dict.fromkeys(path.resolve() for path in found))


def read_table(path: Path) -> KernelTable:
    """``path`` as a :class:`KernelTable`; :class:`LeanVideoError` naming the file, and the entry at fault,
    when it is no table."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LeanVideoError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise LeanVideoError(f"{path}: not an INT8 kernel table: not valid JSON ({exc})") from exc
    if _is_bench_data(data):
        raise LeanVideoError(f"{path}: {BENCH_TABLE}")
    if problem := _structure_problem(data):
        raise LeanVideoError(f"{path}: not an INT8 kernel table: {problem}")
    rows = []
    for key, entry in data["entries"].items():
        where = f"{path}: INT8 kernel table entry {key!r}"
        if not isinstance(entry, dict):
            raise LeanVideoError(f"{where} is {json_kind(entry)}, not an object")
        if entry.get("kernel") not in (*KERNELS, None):  # a missing one is said below
            raise LeanVideoError(
                f"{where}: kernel {entry['kernel']!r} is none of {', '.join(KERNELS)}; servers measure that "
                "shape again (`leanvideo kernels --clear` removes the table)"
            )
        try:
            rows.append(KernelRow(ShapeClass.from_key(str(key)), Choice.from_dict(entry)))
        except KeyError as exc:
            raise LeanVideoError(f"{where} has no {exc}") from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise LeanVideoError(f"{where}: {exc}") from exc
    fingerprint = dict(data["fingerprint"])
    return KernelTable(
        path=path, fingerprint=fingerprint, current=fingerprint == current_fingerprint(), rows=tuple(rows)
    )


def _structure_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a table (an object with the objects ``fingerprint`` and ``entries``),
    or ``None``."""
    if not isinstance(data, dict):
        return f"it is {json_kind(data)}, not an object with 'fingerprint' and 'entries'"
    for name in ("fingerprint", "entries"):
        if name not in data:
            return f"it has no {name!r}"
        if not isinstance(data[name], dict):
            return f"its {name!r} is {json_kind(data[name])}, not an object"
    return None


def read_tables(paths: Iterable[Path]) -> list[KernelTable]:
    return [read_table(path) for path in paths]


def clear_tables(paths: Iterable[Path]) -> list[Path]:
    """Delete the table files (the next INT8 load measures again); returns those removed. Every file is
    checked first: when one is neither named as a table (``int8_kernels.json``, broken or not) nor a
    kernel table of any version by its content, nothing is deleted.

    Raises:
        LeanVideoError: a file is not a kernel table (named).
    """
    paths = list(paths)
    for path in paths:
        _check_is_table(path)
    for path in paths:
        path.unlink(missing_ok=True)
    return paths


def _is_bench_table(path: Path) -> bool:
    """Whether ``path`` is ``int8_bench.py --json``'s table (a list of ``{shape, kernel, ratio}``)."""
    try:
        return _is_bench_data(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return False


def _is_bench_data(data: Any) -> bool:
    """``int8_bench.py``'s output by its content: its ``--json`` list of rows, or its whole report (an
    object of schema ``leanvideo.int8_bench``, as ``benchmarks/results/`` keep them)."""
    if isinstance(data, dict):
        return data.get("schema") == BENCH_SCHEMA
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(row, dict) and "shape" in row for row in data)
    )


def _check_is_table(path: Path) -> None:
    if _is_bench_table(path):
        raise LeanVideoError(f"{path}: {BENCH_TABLE}; nothing was removed")
    if path.name == TABLE_NAME:
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        schema = data["fingerprint"]["schema"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LeanVideoError(f"{path}: not an INT8 kernel table, so nothing was removed") from exc
    if schema != TABLE_SCHEMA:
        raise LeanVideoError(f"{path}: its schema is {schema!r}, not {TABLE_SCHEMA!r}; nothing was removed")
