"""The versioned benchmark result document (``bench.json``), written once and never overwritten.

Schema ``leanvideo.bench`` version 2: ``schema``, ``version``, ``created`` (ISO, UTC), ``matrix``
(``path``, ``sha256`` of the file, ``workflow``, ``mode``, ``warmups``, ``repeats``, ``baseline``,
``reference``, ``order``), ``environment`` (the first run record's: ComfyUI version/commit/argv, torch,
device, pack and runner versions, host), ``modes`` (the launch checks: ``logs`` per server the bench
started, and soak/load/consistency when asked), ``server_lost`` (what ended a server's runs early, when
one stopped answering) and ``variants`` (each :meth:`VariantResult.to_json`: runs, summaries, flags;
each run points at its own immutable ``run.json``, schema ``leanvideo.run`` v2).

Versions: 2 added ``modes.logs``, ``server_lost``, a soak's ``planned_rounds`` and a load test's
``planned_jobs`` and ``failed_jobs`` (a load test's ``jobs`` counts the jobs that ran).

Example::

    check_out_unused(out_dir)          # before any run: a folder holding a result is refused
    path = write_document(build_document(matrix, results, environment), out_dir / "bench.json")
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.matrix import Matrix
from benchmarks.results import VariantResult
from runner.errors import UsageError
from runner.tracking.record import write_run_record

# What a bench writes beside bench.json; one that is there already is the user's, never written over
REPORT_FILES = ("report.md", "report.csv", "total_time.png", "phases.png")


def check_out_unused(out: Path) -> None:
    """Raise :class:`UsageError` (naming ``--out``) when ``out`` holds a result, the run folders of a
    bench that did not finish, or a file the reports would write over: results are immutable."""
    if (out / "bench.json").exists():
        raise UsageError(f"--out {out} already holds a result (results are immutable): choose another")
    if leftovers := [name for name in ("runs", "workflows", "servers") if (out / name).exists()]:
        raise UsageError(
            f"--out {out} holds {', '.join(f'{name}/' for name in leftovers)} of a bench that did not finish "
            "(no bench.json: interrupted?); their runs would mix with the new ones: choose another --out, or "
            "remove those folders"
        )
    if theirs := [name for name in REPORT_FILES if (out / name).exists()]:  # never written over
        raise UsageError(
            f"--out {out} holds {', '.join(theirs)}, which the bench would write over: choose another --out, "
            "or move the file away"
        )


BENCH_SCHEMA = "leanvideo.bench"
BENCH_VERSION = 2


def build_document(
    matrix: Matrix,
    results: list[VariantResult],
    environment: dict[str, Any],
    *,
    modes: dict[str, Any] | None = None,
    warmups: int | None = None,
    repeats: int | None = None,
) -> dict[str, Any]:
    """The result document; see the module docstring."""
    return {
        "schema": BENCH_SCHEMA,
        "version": BENCH_VERSION,
        "created": datetime.now(timezone.utc).isoformat(),
        "matrix": {
            "path": str(matrix.path),
            "sha256": hashlib.sha256(matrix.path.read_bytes()).hexdigest(),
            "workflow": str(matrix.workflow),
            "mode": matrix.mode,
            "warmups": matrix.warmups if warmups is None else warmups,
            "repeats": matrix.repeats if repeats is None else repeats,
            "baseline": matrix.baseline,
            "reference": matrix.reference,
            "memory_tolerance_mb": matrix.memory_tolerance_mb,
        },
        "environment": environment,
        "modes": modes or {},
        "variants": [result.to_json() for result in results],
    }


def write_document(document: dict[str, Any], path: Path) -> Path:
    """Write ``document`` as JSON; refuses to overwrite (results are immutable)."""
    return write_run_record(document, path)
