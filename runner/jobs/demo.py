"""The project's main job on its embedded default: tiny LTXV text-to-video on a fresh server.

``run_demo`` writes the tiny models on first use, starts a pinned ComfyUI with our node pack (and the
fixture helper nodes the tiny model needs), runs ``workflows/ltxv_tiny_t2v.api.json``, downloads the
MP4, writes a run record beside it and stops the server.

Example::

    outcome = run_demo(Path("leanvideo-out"), find_workspace())
    print(outcome.video, outcome.record_path)
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from runner.errors import PromptFailedError
from runner.fixtures import write_fixtures
from runner.graph.workflow import load_workflow
from runner.local.server import ComfyServer, ServerConfig, pick_free_port
from runner.local.workspace import FIXTURE_NODES_DIR, NODE_PACK_DIR, WORKFLOWS_DIR, Workspace
from runner.tracking.outputs import download_outputs
from runner.tracking.prompt import run_prompt
from runner.tracking.record import build_run_record, collect_server_info, write_run_record
from runner.tracking.result import PromptResult
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

DEMO_WORKFLOW = WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"

__all__ = ["DEMO_WORKFLOW", "DemoOutcome", "load_workflow", "run_demo"]


@dataclass(frozen=True)
class DemoOutcome:
    """Where the demo's files went and how long each phase took."""

    video: Path
    record_path: Path
    result: PromptResult
    fixtures_seconds: float
    server_ready_seconds: float
    total_seconds: float


def run_demo(
    out_dir: Path,
    workspace: Workspace,
    *,
    port: int | None = None,
    extra_args: tuple[str, ...] = (),
    timeout: float = 600.0,
) -> DemoOutcome:
    """Run the tiny text-to-video demo end to end; see the module docstring."""
    began = time.monotonic()
    write_fixtures(workspace.models_dir, workspace.comfyui_dir, python=workspace.python)
    fixtures_seconds = time.monotonic() - began
    workflow = load_workflow(DEMO_WORKFLOW)
    workspace.servers_dir.mkdir(parents=True, exist_ok=True)
    state_dir = Path(tempfile.mkdtemp(prefix="demo-", dir=workspace.servers_dir))
    config = ServerConfig(
        comfyui_dir=workspace.comfyui_dir,
        state_dir=state_dir,
        models_dir=workspace.models_dir,
        python=workspace.python,
        port=port or pick_free_port(),
        custom_node_dirs=(NODE_PACK_DIR, FIXTURE_NODES_DIR),
        extra_args=extra_args,
    )
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        started = time.monotonic()
        with ComfyServer(config) as server:
            ready_seconds = time.monotonic() - started
            client = ComfyClient(server.url)
            try:
                server_info = collect_server_info(
                    client.get_json("/system_stats"), client.get_json("/leanvideo/info")
                )
                result = run_prompt(client, workflow, timeout=timeout)
                files = download_outputs(client, result.outputs, out_dir, prefix=f"demo-{stamp}-")
            finally:
                client.close()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    videos = [f.path for f in files if f.path.suffix in {".mp4", ".webm"}]
    if not videos:
        raise PromptFailedError(f"prompt {result.prompt_id} finished but produced no video file")
    record = build_run_record(result, workflow, DEMO_WORKFLOW, server_info, files)
    record_path = write_run_record(record, videos[0].with_suffix(".json"))
    return DemoOutcome(
        video=videos[0],
        record_path=record_path,
        result=result,
        fixtures_seconds=fixtures_seconds,
        server_ready_seconds=ready_seconds,
        total_seconds=time.monotonic() - began,
    )
