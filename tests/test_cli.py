"""`leanvideo serve --background` / `leanvideo stop` against the real pinned server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from runner.local.background import find_running_servers
from runner.local.workspace import Workspace

pytestmark = pytest.mark.integration


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "leanvideo"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for command in ("serve", "stop", "fixtures", "demo", "run", "workflow", "quantize", "bench"):
        assert command in done.stdout


def test_serve_background_then_stop(workspace: Workspace, free_port: int) -> None:
    started = _cli(
        "serve", "--background", "--port", str(free_port), "--", "--cpu", "--preview-method", "auto"
    )
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"http://127.0.0.1:{free_port}" in started.stdout
    records = [r for r in find_running_servers(workspace.servers_dir) if r["port"] == free_port]
    assert len(records) == 1
    pid = int(str(records[0]["pid"]))
    argv = httpx.get(f"http://127.0.0.1:{free_port}/system_stats").json()["system"]["argv"]
    assert argv[argv.index("--preview-method", argv.index("--cpu")) + 1] == "auto"  # passthrough last

    stopped = _cli("stop", "--port", str(free_port))
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped ComfyUI on port {free_port}" in stopped.stdout
    deadline = time.monotonic() + 20
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} still alive after stop"
        time.sleep(0.2)
    again = _cli("stop", "--port", str(free_port)).stdout
    assert again.startswith("no server started with `serve --background` runs")


def test_serve_on_a_taken_port_exits_2_with_a_clear_message(workspace: Workspace, free_port: int) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", free_port))
        squatter.listen()
        done = _cli("serve", "--port", str(free_port))
    assert done.returncode == 2  # a --port that cannot be used, as in demo and bench
    assert f"Port {free_port}" in done.stderr and "already in use" in done.stderr


def test_serve_refuses_what_it_cannot_use_before_starting(
    workspace: Workspace, free_port: int, tmp_path: Path
) -> None:
    for port in ("99999", "0", "http"):
        done = _cli("serve", "--port", port)
        assert done.returncode == 2 and f"{port!r} is not a port (1-65535)" in done.stderr
    done = _cli("serve", "--port", str(free_port), "--models", str(tmp_path / "none"))
    assert done.returncode == 2 and f"argument --models: {tmp_path / 'none'}: no such folder" in done.stderr
    for host in ("192.0.2.1", "not-a-host.invalid"):  # TEST-NET-1: not this machine's; a name that is none
        done = _cli("serve", "--port", str(free_port), "--host", host)
        assert done.returncode == 2 and f"argument --host: cannot listen on {host!r}" in done.stderr
        assert "already in use" not in done.stderr
    assert not (workspace.servers_dir / str(free_port)).exists()
    taken = tmp_path / "a-file"
    taken.write_text("kept")
    done = _cli("demo", "--out", str(taken))
    assert done.returncode == 2 and f"--out {taken}: {taken} is a file, not a folder" in done.stderr
    assert taken.read_text() == "kept"
    done = _cli("demo", "--port", "99999")
    assert done.returncode == 2 and "'99999' is not a port" in done.stderr
    done = _cli("serve", "--port", str(free_port), "--models", str(taken))
    assert done.returncode == 2 and f"argument --models: {taken}: a file, not a folder" in done.stderr


@pytest.mark.parametrize("command", [("run",), ("workflow", "validate"), ("bench",)])
def test_a_set_without_its_value_is_a_usage_error(command: tuple[str, ...], tmp_path: Path) -> None:
    """Exit 2 before anything is read or started, naming the spec (not 5, a rejected workflow)."""
    done = _cli(*command, str(tmp_path / "any.json"), "--set", "Sample.noise_seed")
    assert done.returncode == 2
    assert "argument --set: 'Sample.noise_seed': expected NODE.input=VALUE" in done.stderr


def test_the_cli_starts_without_importing_torch() -> None:
    """`leanvideo --help` (and every command until it needs torch) stays fast: 0.4 s, not 2.3 s."""
    code = "import sys, runner.cli.main; runner.cli.main.build_parser(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_quantize_families_match_the_policy() -> None:
    """The CLI lists these without importing torch; they must stay the INT8 core's."""
    from leanvideo.int8.policy import FAMILY_RULES
    from leanvideo.int8.spec import Int8WeightConfig

    from runner.cli.quantize import DEFAULT_CONVROT_GROUP, FAMILIES

    assert tuple(sorted(FAMILY_RULES)) == FAMILIES
    assert Int8WeightConfig().convrot_group == DEFAULT_CONVROT_GROUP
