"""Shared by the batch tests: jobs files of tiny LTXV runs, the CLI in a child process, what the
servers ran, and the checks that every job has exactly one result and one set of files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from runner.batch.queue import JobState, list_jobs, open_client
from runner.install.pin import sha256_file
from runner.local.workspace import REPO_ROOT


def batch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "runner.cli.main", "batch", *args]


def start_batch(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """``leanvideo batch ARGS`` in a child process of its own group, its output into ``log``."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            batch_command(*args),
            cwd=REPO_ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "160"},
        )


def run_batch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        batch_command(*args), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def history_ids(server_url: str) -> set[str]:
    return set(httpx.get(f"{server_url}/history", timeout=30).json())


def jobs_of(db_url: str, name: str) -> list[JobState]:
    with open_client(db_url) as client:
        return list_jobs(client, name)


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


def assert_exactly_once(jobs: list[JobState], out: Path, count: int) -> list[dict[str, Any]]:
    """Each job: one successful record, one folder holding one video and its result.json, hashes
    that match the files; the folders are all there is (no second copy anywhere)."""
    records = [job.record or {} for job in jobs]
    assert sorted(job.job_id for job in jobs) == sorted(f"job-{n}" for n in range(count))
    assert [job.state for job in jobs] == ["success"] * count, [(j.job_id, j.state, j.error) for j in jobs]
    assert sorted(p.name for p in out.iterdir() if p.name != ".partial") == sorted(j.job_id for j in jobs)
    for job, record in zip(jobs, records, strict=True):
        folder = out / job.job_id
        names = sorted(p.name for p in folder.iterdir())
        assert len(names) == 2 and names[-1] == "result.json" and names[0].endswith(".mp4"), names
        (video,) = record["files"]
        assert video["path"] == str(folder / names[0])
        assert video["sha256"] == sha256_file(folder / names[0])
        assert (
            json.loads((folder / "result.json").read_text(encoding="utf-8"))["prompt_id"]
            == record["prompt_id"]
        )
    assert len({r["files"][0]["sha256"] for r in records}) == count  # other seeds, other videos
    assert len({r["prompt_id"] for r in records}) == count
    return records
