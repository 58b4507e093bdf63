"""A cut connection never turns a finished prompt into a failure: `leanvideo run` through a proxy that
cuts connections (after a time, after some bytes, inside headers and bodies) in front of the real pinned
server; and a server restarted mid-run, which is a lost prompt, reported within the deadline."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from runner.cli.main import main
from runner.install.pin import sha256_file
from runner.jobs.demo import DEMO_WORKFLOW
from runner.local.ports import pick_free_port
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import Workspace
from tests.tcp_proxy import Cut, CuttingProxy

pytestmark = pytest.mark.integration

# Per connection, in turn: closed 0.7 s after it opened (what a short proxy timeout does to keep-alive
# connections and the websocket), cut inside a body, left alone, cut inside the response headers.
SCHEDULE = (Cut(after_s=0.7), Cut(after_bytes=3000), Cut(), Cut(after_bytes=150), Cut(after_s=0.7))


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return str(parts.hostname), int(parts.port or 80)


def history_ids(server_url: str) -> set[str]:
    return set(httpx.get(f"{server_url}/history", timeout=30).json())


def test_twenty_runs_through_a_cutting_proxy_all_finish_once_with_their_outputs(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = history_ids(comfy_server.url)
    seed = random.SystemRandom().randrange(10**6, 10**12)
    prompt_ids: list[str] = []
    cuts_seen = 0
    with CuttingProxy(host_port(comfy_server.url), SCHEDULE) as proxy:
        for run in range(20):
            out = tmp_path / f"run-{run:02d}"
            argv = ["run", str(DEMO_WORKFLOW), "--server", proxy.url, "--out", str(out), "--json"]
            argv += ["--set", f"11.noise_seed={seed + run}", "--set", "9.steps=30", "--timeout", "120"]
            code = main(argv)
            assert code == 0, f"run {run}: exit {code}\n{capsys.readouterr().err[-3000:]}"
            (record_path,) = out.glob("*/run.json")
            record = json.loads(record_path.read_text(encoding="utf-8"))
            assert record["status"] == "success" and not record["partial"]
            (video,) = record["outputs"]
            on_server = comfy_server.config.output_dir / video["subfolder"] / video["server_name"]
            assert video["sha256"] == sha256_file(Path(video["path"])) == sha256_file(on_server)
            assert video["video"]["frames"] == 9
            prompt_ids.append(record["prompt_id"])
            cuts_seen += record["timing"]["retries"] + record["timing"]["reconnects"]
    print(
        f"{proxy.connections} connections, {proxy.cuts} cut; the records count {cuts_seen} retries+reconnects"
    )
    assert proxy.cuts >= 20, f"the proxy cut only {proxy.cuts} of {proxy.connections} connections"
    assert cuts_seen > 0  # the records say what the cuts cost
    assert history_ids(comfy_server.url) - before == set(prompt_ids) and len(set(prompt_ids)) == 20


def test_a_dead_server_fails_within_the_retries_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"  # nothing listens there
    began = time.monotonic()
    code = main(["run", str(DEMO_WORKFLOW), "--server", url, "--retries", "3", "--out", str(tmp_path)])
    assert code == 4
    assert time.monotonic() - began < 30
    assert f"cannot reach ComfyUI at {url}/object_info after 4 attempts" in capsys.readouterr().err


def test_a_server_restarted_mid_run_is_a_lost_prompt_reported_within_the_deadline(
    workspace: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ServerConfig.in_workspace(workspace, tmp_path / "server", cpu=True)
    first = ComfyServer(config)
    first.start()
    out = tmp_path / "out"
    codes: list[int] = []
    argv = ["run", str(DEMO_WORKFLOW), "--server", first.url, "--out", str(out), "--timeout", "120"]
    argv += ["--set", "9.steps=5000", "--set", f"11.noise_seed={random.SystemRandom().randrange(10**9)}"]
    began = time.monotonic()
    runner = threading.Thread(target=lambda: codes.append(main(argv)))
    runner.start()
    second: ComfyServer | None = None
    try:
        deadline = time.monotonic() + 60
        while not httpx.get(f"{first.url}/queue", timeout=10).json()["queue_running"]:
            assert time.monotonic() < deadline, "the prompt never started"
            time.sleep(0.1)
        time.sleep(1.0)  # sampling
        first.stop()
        second = ComfyServer(config)  # same port, empty history and queue: a restart
        second.start()
        runner.join(timeout=120)
    finally:
        if second is not None:
            second.stop()
        first.stop()
    assert not runner.is_alive() and codes == [4]
    assert time.monotonic() - began < 120
    assert "no longer knows prompt" in capsys.readouterr().err
    (record_path,) = out.glob("*/run.json")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    assert record["status"] == "lost" and record["partial"]
    assert record["timing"]["reconnects"] >= 1
