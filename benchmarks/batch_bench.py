"""Batch throughput: the same tiny jobs through ``leanvideo batch`` on 1 and on 2 local servers.

Starts two pinned ComfyUI servers with the tiny LTXV (or uses ``--server`` twice), then for 1 server
and for 2 servers in turn queues ``--jobs`` tiny text-to-video jobs (a new seed each) on a fresh
SQLite queue, runs them with an in-process worker (``per_server`` 1) and prints side by side:

- ``jobs/min``: jobs finished per minute, from the submit to the last result;
- ``attempt overhead``: per job, the attempt's wall time (submit, follow, download, hash, publish)
  minus the server's own execution window — what the coordinator adds around each prompt (median);
- ``idle slot``: per job, the server slot time not spent executing — ``(wall × slots − Σ server
  time) / jobs`` — which adds queue pick-up (DBOS polling) and database writes to the above.

Warm-up jobs (one per server) run first, through the same path, and are not counted. On a CPU-only
machine the two servers share the cores, so 2 servers are not 2× faster here; on one GPU per server
they are.

    .venv/bin/python benchmarks/batch_bench.py                       # starts its own two servers
    .venv/bin/python benchmarks/batch_bench.py --jobs 20 --json batch.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.batch.jobs_file import load_batch
from runner.batch.pool import ServerPool
from runner.batch.queue import FINAL_STATES, BatchSettings, list_jobs, open_client, submit_batch
from runner.batch.worker import BatchWorker
from runner.local.workspace import WORKFLOWS_DIR

WORKFLOW = WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"
RESULT_VERSION = 1


@dataclass(frozen=True)
class Measurement:
    servers: int
    jobs: int
    wall_s: float
    jobs_per_min: float
    attempt_overhead_ms: float  # median over jobs
    idle_slot_ms: float  # per job
    server_s_mean: float


def write_jobs(path: Path, count: int, *, steps: int = 8, first_seed: int = 100) -> Path:
    """A JSONL jobs file of ``count`` tiny text-to-video jobs (ids ``job-0`` …) with ``steps`` steps and
    seeds ``first_seed``, ``first_seed + 1`` …"""
    lines = [
        json.dumps(
            {
                "id": f"job-{n}",
                "workflow": str(WORKFLOW),
                "set": {"Sample.noise_seed": first_seed + n, "LTXV Scheduler.steps": steps},
            }
        )
        for n in range(count)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_batch(
    servers: list[str], count: int, work: Path, name: str, seed: int
) -> tuple[float, list[dict[str, Any]]]:
    """Queue ``count`` jobs, run them on ``servers``; returns the wall time and the result records."""
    db_url = f"sqlite:///{work / f'{name}.sqlite'}"
    jobs = load_batch(write_jobs(work / f"{name}.jsonl", count, first_seed=seed), servers)
    settings = BatchSettings(out_dir=work / name, timeout=600)
    pool = ServerPool(servers, per_server=1)
    with open_client(db_url) as client, BatchWorker(db_url, pool, grace=60, log_level="ERROR"):
        began = time.monotonic()
        submit_batch(client, name, jobs, settings)
        while True:
            states = list_jobs(client, name)
            if len(states) == count and all(s.state in FINAL_STATES for s in states):
                break
            time.sleep(0.05)
        wall = time.monotonic() - began
    failed = [s for s in states if s.state != "success"]
    if failed:
        raise RuntimeError(f"{len(failed)} job(s) failed: {[(s.job_id, s.record) for s in failed][:3]}")
    return wall, [s.record or {} for s in states]


def measure(servers: list[str], count: int, work: Path, seed: int) -> Measurement:
    run_batch(servers, len(servers), work, f"warmup{len(servers)}", seed)
    wall, records = run_batch(servers, count, work, f"measured{len(servers)}", seed + 1000)
    server_s = [float(r["server_seconds"]) for r in records]
    overheads = [(float(r["seconds"]) - float(r["server_seconds"])) * 1000 for r in records]
    idle = (wall * len(servers) - sum(server_s)) / count * 1000
    return Measurement(
        servers=len(servers),
        jobs=count,
        wall_s=round(wall, 3),
        jobs_per_min=round(count / wall * 60, 2),
        attempt_overhead_ms=round(statistics.median(overheads), 1),
        idle_slot_ms=round(idle, 1),
        server_s_mean=round(statistics.fmean(server_s), 3),
    )


def report(results: list[Measurement]) -> None:
    print(f"{'servers':>7}{'jobs':>6}{'wall s':>9}{'jobs/min':>10}{'attempt overhead ms':>21}"
          f"{'idle slot ms/job':>18}{'server s/job':>14}")  # fmt: skip
    for m in results:
        print(f"{m.servers:>7}{m.jobs:>6}{m.wall_s:>9.2f}{m.jobs_per_min:>10.1f}{m.attempt_overhead_ms:>21.1f}"
              f"{m.idle_slot_ms:>18.1f}{m.server_s_mean:>14.3f}")  # fmt: skip
    if len(results) == 2:
        print(f"2 servers vs 1: {results[1].jobs_per_min / results[0].jobs_per_min:.2f}× the throughput")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server", action="append", help="two ComfyUI URLs with the tiny models (default: start two)"
    )
    parser.add_argument("--jobs", type=int, default=12, help="measured jobs per configuration (12)")
    parser.add_argument("--json", type=Path, help="write the result record here")
    args = parser.parse_args(argv)
    if args.server is not None and len(args.server) != 2:
        parser.error("give --server twice (or not at all)")
    work = Path(tempfile.mkdtemp(prefix="leanvideo-batch-bench-"))
    try:
        with ExitStack() as stack:
            servers = args.server or start_servers(stack, work)
            seed = int(time.time())
            results = [measure(servers[:n], args.jobs, work, seed + n * 10_000) for n in (1, 2)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results)
    if args.json:
        record = {
            "schema": "leanvideo.bench.batch",
            "version": RESULT_VERSION,
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


def start_servers(stack: ExitStack, work: Path) -> list[str]:
    from runner.fixtures import write_fixtures
    from runner.local.server import ComfyServer, ServerConfig
    from runner.local.workspace import find_workspace

    ws = find_workspace()
    write_fixtures(ws.models_dir, ws.comfyui_dir, python=ws.python)
    urls = []
    for n in (1, 2):
        config = ServerConfig.in_workspace(ws, work / f"server-{n}")
        urls.append(stack.enter_context(ComfyServer(config)).url)
    return urls


if __name__ == "__main__":
    sys.exit(main())
