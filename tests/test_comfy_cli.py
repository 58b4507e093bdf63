"""comfy-cli, the tool many of our users manage ComfyUI with, as an independent second validator.

Against the real pinned server with our node pack: ``comfy node validate`` accepts the repository,
``comfy workflow validate`` agrees with ``leanvideo workflow validate`` on every shipped workflow (tiny
ones valid; full-size ones invalid only where a model file is absent here), and ``comfy run --wait``
runs the tiny workflow to its video.

comfy-cli must never phone home nor prompt: every call gets a throw-away HOME and config folder,
telemetry, update checks and remote refreshes off (its own environment switches), no stdin, and
``tests/offline_guard`` on ``PYTHONPATH``, which refuses and records any network access off the
loopback interface; each call asserts that record is empty.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from runner.cli.main import main
from runner.graph.models import required_models
from runner.graph.workflow import load_workflow
from runner.local.server import ComfyServer
from runner.local.workspace import REPO_ROOT, WORKFLOWS_DIR

COMFY = Path(sys.executable).parent / "comfy"
# The pin in tests/requirements.txt: the JSON output parsed here is that version's.
COMFY_CLI_PIN = next(
    line.split("==", 1)[1].strip()
    for line in (REPO_ROOT / "tests" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    if line.startswith("comfy-cli==")
)
OFFLINE_GUARD = Path(__file__).parent / "offline_guard"
MANIFEST = json.loads((WORKFLOWS_DIR / "manifest.json").read_text(encoding="utf-8"))["workflows"]
SHIPPED = sorted(p.name for p in WORKFLOWS_DIR.glob("*.json") if p.name != "manifest.json")
TINY_WORKFLOW = WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"
# comfy-cli 1.23.0's switches (read in its source): telemetry (comfy_cli/tracking.py), the PyPI
# version check (update.py), the GitHub node-annotation refresh (cql/annotations_source.py), the
# knowledge enrichment (knowledge.py), the detached job watcher (command/run/watcher.py). `comfy launch`
# (not run here) also refreshes a knowledge bundle from cloud.comfy.org unless COMFY_KNOWLEDGE_FILE is set.
OFFLINE_ENV = {
    "DO_NOT_TRACK": "1",
    "COMFY_NO_TELEMETRY": "1",
    "COMFY_NO_UPDATE_CHECK": "1",
    "COMFY_CLI_NO_REMOTE_REFRESH": "1",
    "COMFY_KNOWLEDGE_DISABLE": "1",
    "COMFY_NO_WATCH": "1",
    "COMFY_WHERE": "local",
    "NO_COLOR": "1",
}


@dataclass(frozen=True)
class ComfyCli:
    """Runs the installed ``comfy`` in the repository with a private HOME, offline."""

    env: dict[str, str]
    offline_log: Path

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(COMFY), *args],
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        refused = self.offline_log.read_text(encoding="utf-8").split() if self.offline_log.exists() else []
        assert refused == [], f"`comfy {' '.join(args)}` tried to reach {sorted(set(refused))}"
        return result

    def envelope(self, *args: str) -> tuple[int, dict[str, Any]]:
        """Exit code and the JSON envelope (``comfy --json …``: one object, the last stdout line)."""
        result = self.run("--json", *args)
        lines = result.stdout.strip().splitlines()
        assert lines, f"`comfy --json {' '.join(args)}` printed nothing; stderr: {result.stderr[-2000:]}"
        return result.returncode, dict(json.loads(lines[-1]))


def offline_env(home: Path, offline_log: Path) -> dict[str, str]:
    """This process's environment without any COMFY_* setting of the user's, offline, homed in ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_")}
    env.update(OFFLINE_ENV)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        LEANVIDEO_OFFLINE_LOG=str(offline_log),
        PYTHONPATH=os.pathsep.join(filter(None, [str(OFFLINE_GUARD), env.get("PYTHONPATH")])),
    )
    return env


@pytest.fixture(scope="module")
def comfy_cli(tmp_path_factory: pytest.TempPathFactory) -> ComfyCli:
    """comfy-cli with tracking disabled in its (throw-away) config, as a user would do once."""
    try:
        installed = importlib.metadata.version("comfy-cli")
    except importlib.metadata.PackageNotFoundError:
        installed = "none"
    assert installed == COMFY_CLI_PIN and COMFY.is_file(), (
        f"comfy-cli {installed} installed, {COMFY_CLI_PIN} pinned in tests/requirements.txt: run install.py"
    )
    home = tmp_path_factory.mktemp("comfy-cli-home")
    log = home / "offline.log"
    cli = ComfyCli(offline_env(home, log), log)
    result = cli.run("--skip-prompt", "tracking", "disable")
    assert result.returncode == 0 and "Tracking is now disabled." in result.stdout, (
        result.stdout + result.stderr
    )
    config = (home / ".config" / "comfy-cli" / "config.ini").read_text(encoding="utf-8")
    assert "enable_tracking = False" in config, config
    return cli


def test_offline_guard_refuses_and_records_a_connection(tmp_path: Path) -> None:
    log = tmp_path / "offline.log"
    reach_out = "import urllib.request; urllib.request.urlopen('http://pypi.org/', timeout=5)"
    result = subprocess.run(
        [sys.executable, "-c", reach_out],
        env=offline_env(tmp_path, log),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0 and "offline guard: refused" in result.stderr, result.stderr
    assert log.read_text(encoding="utf-8").split() == ["pypi.org"]


def test_comfy_node_validate_accepts_the_repository(comfy_cli: ComfyCli) -> None:
    """What the registry checks before publishing: pyproject's [project] and [tool.comfy], then ruff's
    exec/eval/one-line-statements rules over the tree."""
    result = comfy_cli.run("node", "validate")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "All validation checks passed successfully" in output, output
    assert "Warning" not in output and "Error" not in output, output


def _our_verdict(api_path: Path, server_url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    code = main(["workflow", "validate", str(api_path), "--server", server_url, "--json"])
    verdict = dict(json.loads(capsys.readouterr().out))
    assert code == (0 if verdict["valid"] else 5), verdict
    return verdict


@pytest.mark.integration
@pytest.mark.parametrize("name", SHIPPED)
def test_comfy_workflow_validate_agrees_with_ours(
    name: str, comfy_cli: ComfyCli, comfy_server: ComfyServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """An editor (UI) file is converted by comfy-cli itself; ours is compared through its API twin,
    which tests/test_ui_workflows.py proves the editor turns it into."""
    assert name in MANIFEST, f"workflows/{name} is not in workflows/manifest.json"
    api_path = WORKFLOWS_DIR / name.replace(".ui.json", ".api.json")
    host, port = comfy_server.config.host, str(comfy_server.config.port)
    code, envelope = comfy_cli.envelope(
        "workflow", "validate", "--workflow", f"workflows/{name}", "--host", host, "--port", port
    )
    data = envelope["data"]
    assert data["warnings"] == [], data["warnings"]
    ours = _our_verdict(api_path, comfy_server.url, capsys)
    our_errors = {(p["node_id"], p["input"]) for p in ours["problems"] if p["kind"] == "error"}
    their_errors = {(e["node_id"], e["field"]) for e in data["errors"]}
    assert data["valid"] is ours["valid"] and envelope["ok"] is ours["valid"], (data, ours)
    assert code == (0 if ours["valid"] else 1), envelope
    assert their_errors == our_errors, (data["errors"], ours["problems"])

    if MANIFEST[name]["models"] == "tiny":
        assert data["valid"] and data["errors"] == [], data["errors"]
        return
    # Full size: invalid here only because a model file the workflow names is absent from the server.
    assert data["errors"], f"{name} should name model files that are absent here"
    files = {(ref.node_id, ref.input_name): ref.name for ref in required_models(load_workflow(api_path))}
    for error in data["errors"]:
        where = (error["node_id"], error["field"])
        assert where in files, f"{name}: comfy-cli flags node {where[0]} input {where[1]}, no model file"
        # "not in N known options" or, when the model folder is empty, "is unavailable: … 0 installed"
        assert error["code"] in ("unknown_enum_value", "no_options_available"), error
        assert error["message"].startswith(f"{files[where]!r} "), error
    for problem in ours["problems"]:
        assert problem["message"].startswith("model file "), problem


@pytest.mark.integration
def test_comfy_run_waits_for_the_tiny_workflow_to_finish(
    comfy_cli: ComfyCli, comfy_server: ComfyServer
) -> None:
    host, port = comfy_server.config.host, str(comfy_server.config.port)
    code, envelope = comfy_cli.envelope(
        "run",
        "--workflow",
        str(TINY_WORKFLOW.relative_to(REPO_ROOT)),
        "--host",
        host,
        "--port",
        port,
        "--wait",
        "--no-notify",
    )
    data = envelope["data"]
    assert code == 0 and envelope["ok"] and data["status"] == "completed", envelope
    entry = httpx.get(f"{comfy_server.url}/history/{data['prompt_id']}", timeout=30).json()[data["prompt_id"]]
    assert entry["status"]["status_str"] == "success", entry["status"]

    # comfy-cli reports the output as a /view URL (or, for a workspace it launched, a local path)
    [item] = [i for output in entry["outputs"].values() for i in output.get("images", [])]
    [reported] = data["outputs"]
    assert item["filename"] in reported, (reported, item)
    video = comfy_server.config.output_dir / item["subfolder"] / item["filename"]
    nodes = json.loads(TINY_WORKFLOW.read_text(encoding="utf-8")).values()
    latent = next(n["inputs"] for n in nodes if n["class_type"] == "EmptyLTXVLatentVideo")
    with av.open(str(video)) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == latent["length"], video
    assert (frames[0].width, frames[0].height) == (latent["width"], latent["height"]), video
