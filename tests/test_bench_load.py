"""``leanvideo bench --load`` against two real pinned ComfyUI servers (CPU, tiny models): jobs are
spread over both, the latency figures hang together, and a verdict comes out.

Two throw-away servers of its own: the shared ``comfy_server`` is left alone (load jobs would change
the memory history other tests measure against)."""

from __future__ import annotations

import argparse
import io
import itertools
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from benchmarks import harness
from runner.cli.bench import add_bench_parser, run_bench
from runner.fixtures import FixtureSet
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import WORKFLOWS_DIR, Workspace

pytestmark = pytest.mark.integration

JOBS = 4
CONCURRENCY = 2


@pytest.fixture
def two_servers(workspace: Workspace, tiny_models: FixtureSet, tmp_path: Path) -> Iterator[list[str]]:
    """Two servers with the pack, the fixture nodes and the tiny models.

    Started one after the other from this thread: a server dies with the thread that started it
    (``PR_SET_PDEATHSIG``), so a start from a worker thread would not outlive that thread."""
    configs = [ServerConfig.in_workspace(workspace, tmp_path / f"server-{i}", cpu=True) for i in range(2)]
    with ExitStack() as stack:
        yield [stack.enter_context(ComfyServer(config)).url for config in configs]


def _matrix(tmp_path: Path) -> Path:
    """One variant, one measured run: the load mode is what is under test."""
    path = tmp_path / "load.toml"
    workflow = WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"
    path.write_text(
        f'[bench]\nworkflow = "{workflow}"\nwarmups = 0\nrepeats = 1\nmode = "warm"\ntimeout_s = 120\n'
        '[[variant]]\nname = "tiny 4-step"\nset = ["9.steps=4"]\n',
        encoding="utf-8",
    )
    return path


def test_load_spreads_jobs_over_two_servers(tmp_path: Path, two_servers: list[str]) -> None:
    started = time.perf_counter()
    out = tmp_path / "bench"
    parser = argparse.ArgumentParser(prog="leanvideo")
    add_bench_parser(parser.add_subparsers(dest="command"))
    argv = [str(_matrix(tmp_path)), "--out", str(out), "--no-plots", "--load"]
    argv += ["--concurrency", str(CONCURRENCY), "--jobs", str(JOBS)]
    for url in two_servers:
        argv += ["--server", url]
    buffer = io.StringIO()
    code = run_bench(parser.parse_args(["bench", *argv]), Console(file=buffer, width=250))
    text = buffer.getvalue()
    print(text)
    assert code == 0
    load: dict[str, Any] = json.loads((out / "bench.json").read_text(encoding="utf-8"))["modes"]["load"]
    print(json.dumps({k: v for k, v in load.items() if k != "runs"}, indent=1))
    assert load["variant"] == "tiny 4-step"
    assert (load["servers"], load["concurrency"], load["jobs"]) == (two_servers, CONCURRENCY, JOBS)

    # Spread: every job went to one of the two servers, each server got some.
    rows = load["runs"]
    assert sorted(r["job"] for r in rows) == list(range(JOBS))
    assert {r["server"] for r in rows} == set(two_servers)
    assert load["jobs_per_server"] == {url: sum(r["server"] == url for r in rows) for url in two_servers}
    assert sum(load["jobs_per_server"].values()) == JOBS
    # As many clients as servers: least-busy dispatch never stacks two jobs on one server.
    for url in two_servers:
        spans = sorted((r["sent_s"], r["done_s"]) for r in rows if r["server"] == url)
        assert all(done <= sent for (_, done), (sent, _) in itertools.pairwise(spans)), spans

    # The figures hang together.
    latency = load["latency_s"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
    assert latency["p99"] <= max(r["wall_s"] for r in rows) + 1e-9
    assert load["throughput_jobs_per_min"] == pytest.approx(JOBS / load["elapsed_s"] * 60)
    for row in rows:
        parts = row["queue_s"] + row["server_execution_s"]
        assert row["server_execution_s"] > 0.05  # distinct seeds: the sampler really ran
        # what is left is the client's own time (submit, websocket, history read): under a second, but
        # on two shared cores busy with other work it has reached 0.58 s of a 2.2 s job
        assert abs(row["wall_s"] - parts) <= max(1.0, 0.3 * row["wall_s"]), row
    assert load["execution_s"] > load["queue_wait_s"]  # one job per server at a time: little queueing
    assert load["verdict"] == "keeping up"
    [said] = [line for line in text.splitlines() if line.startswith("- load: ")]  # the report, in words
    assert said.startswith("- load: keeping up: ") and "per server: " in said
    assert all(url in said.split("per server: ")[1] for url in two_servers), said
    # The logs launch check is said to be missing, not left out: these servers' logs are not the bench's
    logs = json.loads((out / "bench.json").read_text(encoding="utf-8"))["modes"]["logs"]
    assert logs == {url: {"verdict": harness.LOGS_NOT_CHECKED} for url in two_servers}  # each said
    assert "logs: " in text and "not checked" in text
    print(f"load test body: {time.perf_counter() - started:.1f} s")
