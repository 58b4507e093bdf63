"""A batch's results manifest (``results.json`` + ``results.csv``) and its progress in numbers.

One row per job id: status, server, attempts, seconds, the output files with their sha256, and for
a failure the node id and message. JSON first (everything), CSV second (one line per job, files
joined with ``;``). Both are written to a temporary name and renamed, so a reader never sees half.

Example::

    json_path, csv_path = write_manifest(list_jobs(client, "nightly"), Path("out"), "nightly")
    print(summarize(list_jobs(client, "nightly")).counts)
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.batch.queue import FINAL_STATES, JobState

MANIFEST_VERSION = 1
CSV_COLUMNS = (
    "job_id",
    "status",
    "server",
    "attempts",
    "seconds",
    "files",
    "sha256",
    "error_node",
    "error_message",
)


def job_row(job: JobState) -> dict[str, Any]:
    """The manifest entry of one job."""
    record = job.record or {}
    error = record.get("error") or ({"message": job.error} if job.error else None)
    return {
        "job_id": job.job_id,
        "status": job.state,
        "server": record.get("server"),
        "worker": record.get("worker") or job.worker,
        "attempts": record.get("attempts"),
        "seconds": record.get("seconds"),
        "server_seconds": record.get("server_seconds"),
        "prompt_id": record.get("prompt_id"),
        "files": [
            {"path": f["path"], "sha256": f["sha256"], "bytes": f["bytes"]} for f in record.get("files", [])
        ],
        "error": error,
        "attempt_log": record.get("attempt_log", []),
        "workflow_id": job.workflow_id,
    }


def write_manifest(jobs: list[JobState], out_dir: Path, batch: str) -> tuple[Path, Path]:
    """Write ``results.json`` and ``results.csv`` for ``jobs`` into ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [job_row(job) for job in jobs]
    summary = summarize(jobs)
    document = {
        "version": MANIFEST_VERSION,
        "batch": batch,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "counts": dict(summary.counts),
        "jobs": rows,
    }
    json_path = _write_atomic(out_dir / "results.json", json.dumps(document, indent=2) + "\n")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        error = row["error"] or {}
        writer.writerow(
            {
                "job_id": row["job_id"],
                "status": row["status"],
                "server": row["server"] or "",
                "attempts": row["attempts"] or "",
                "seconds": row["seconds"] if row["seconds"] is not None else "",
                "files": ";".join(f["path"] for f in row["files"]),
                "sha256": ";".join(f["sha256"] for f in row["files"]),
                "error_node": error.get("node_id") or "",
                "error_message": (error.get("message") or "").replace("\n", " "),
            }
        )
    csv_path = _write_atomic(out_dir / "results.csv", buffer.getvalue())
    return json_path, csv_path


@dataclass(frozen=True)
class BatchSummary:
    """Counts by state, and per server the jobs it finished and failed."""

    counts: Counter[str]
    per_server: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(self.counts[s] for s in FINAL_STATES)

    @property
    def all_done(self) -> bool:
        return self.finished == self.total


def summarize(jobs: list[JobState]) -> BatchSummary:
    counts: Counter[str] = Counter(job.state for job in jobs)
    per_server: dict[str, Counter[str]] = {}
    for job in jobs:
        server = (job.record or {}).get("server")
        if server:
            per_server.setdefault(str(server), Counter())[job.state] += 1
    return BatchSummary(counts, per_server)


def _write_atomic(path: Path, text: str) -> Path:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
    return path
