"""Runner overhead: 50 sequential tiny jobs, client end to end vs the server's own execution window.

For each job the runner submits the tiny LTXV workflow (a new seed each time, so the sampler, decoder
and encoder really run; the loaders stay cached as they would in any batch), follows it to its history
entry and reports:

- ``wall``: what the client sees, submit → history entry read (``PromptResult.wall_seconds``);
- ``server``: the server's execution window, ``execution_start`` → ``execution_success`` from its own
  millisecond timestamps;
- ``overhead = wall − server``: HTTP, websocket, queue pick-up and history write/read — everything the
  runner adds around the work (goal ≤ 30 ms per job, median);
- ``runner cpu``: CPU time the runner process itself spent per job.

Warm-up jobs are run first and kept apart from the measured ones. Median, p10/p90 and the spread
warning (standard deviation ≥ 10 % of the mean) come from :mod:`benchmarks.stats`.

    .venv/bin/python benchmarks/runner_overhead.py                 # starts its own server on a free port
    .venv/bin/python benchmarks/runner_overhead.py --server http://127.0.0.1:8188 --json result.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.stats import summarize
from runner.graph.workflow import load_workflow
from runner.jobs.run import collect_environment
from runner.local.workspace import WORKFLOWS_DIR
from runner.tracking.prompt import run_prompt
from runner.tracking.record import workflow_digest
from runner.transport.client import ComfyClient

WORKFLOW = WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"
GOAL_MS = 30.0
RESULT_VERSION = 2  # 2: p10/p90 linearly interpolated (benchmarks.stats), not the nearest job


@dataclass(frozen=True)
class Job:
    wall_ms: float
    server_ms: float
    overhead_ms: float
    runner_cpu_ms: float
    queue_ms: float


def run_jobs(client: ComfyClient, workflow: dict[str, Any], count: int, first_seed: int) -> list[Job]:
    jobs = []
    for index in range(count):
        workflow["11"]["inputs"]["noise_seed"] = first_seed + index
        cpu = time.process_time()
        result = run_prompt(client, workflow, timeout=300)
        cpu_ms = (time.process_time() - cpu) * 1000
        if result.server_seconds is None:
            raise RuntimeError(f"prompt {result.prompt_id} has no server execution window")
        wall_ms, server_ms = result.wall_seconds * 1000, result.server_seconds * 1000
        jobs.append(Job(wall_ms, server_ms, wall_ms - server_ms, cpu_ms, result.queue_seconds * 1000))
    return jobs


def report(jobs: list[Job]) -> dict[str, dict[str, float]]:
    stats: dict[str, dict[str, float]] = {}
    print(f"{'ms per job':<14}{'median':>9}{'mean':>9}{'stdev':>9}{'p10':>9}{'p90':>9}{'max':>9}")
    for name in Job.__dataclass_fields__:
        summary = summarize([getattr(job, name) for job in jobs])
        row = {
            "median": summary.median,
            "mean": summary.mean,
            "stdev": summary.stdev,
            "p10": summary.p10,
            "p90": summary.p90,
            "max": summary.maximum,
        }
        stats[name] = row
        print(f"{name:<14}" + "".join(f"{value:>9.2f}" for value in row.values()))
        if summary.spread_warning:
            print(f"  warning: {name} is unstable (stdev {summary.stdev:.2f} ms ≥ 10 % of the mean)")
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server", help="ComfyUI URL with the fixture nodes and tiny models (default: start one)"
    )
    parser.add_argument(
        "--port", type=int, help="port of the server this script starts (default: a free one)"
    )
    parser.add_argument("--jobs", type=int, default=50, help="measured jobs (default 50)")
    parser.add_argument("--warmup", type=int, default=3, help="jobs run first and left out (default 3)")
    parser.add_argument("--json", type=Path, help="write the result record here")
    args = parser.parse_args(argv)
    if args.server:
        return measure(args.server, args)
    from runner.fixtures import write_fixtures
    from runner.local.server import ComfyServer, ServerConfig
    from runner.local.workspace import find_workspace

    ws = find_workspace()
    write_fixtures(ws.models_dir, ws.comfyui_dir, python=ws.python)
    config = ServerConfig.in_workspace(
        ws, ws.servers_dir / f"bench-{int(time.time())}", port=args.port or None
    )
    with ComfyServer(config) as server:
        return measure(server.url, args)


def measure(url: str, args: argparse.Namespace) -> int:
    workflow = load_workflow(WORKFLOW)
    seed = int(time.time() * 1000)
    with ComfyClient(url) as client:
        environment = collect_environment(client)
        run_jobs(client, workflow, args.warmup, seed)
        jobs = run_jobs(client, workflow, args.jobs, seed + args.warmup)
    print(f"{args.jobs} sequential tiny jobs on {url} (after {args.warmup} warm-up jobs)")
    stats = report(jobs)
    median = stats["overhead_ms"]["median"]
    verdict = "meets" if median <= GOAL_MS else "MISSES"
    print(f"runner overhead: median {median:.1f} ms per job ({verdict} the goal of ≤ {GOAL_MS:.0f} ms)")
    if args.json:
        record = {
            "schema": "leanvideo.bench.runner_overhead",
            "version": RESULT_VERSION,
            "environment": environment,
            "workflow": {"path": str(WORKFLOW), "sha256": workflow_digest(load_workflow(WORKFLOW))},
            "jobs": [asdict(job) for job in jobs],
            "stats": stats,
            "goal_ms": GOAL_MS,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0 if median <= GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
