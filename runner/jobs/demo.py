"""The project's main job on its embedded default: the tiny LTXV through LeanVideo's nodes, then
through stock ComfyUI, side by side.

``run_demo`` writes the tiny models on first use (their INT8 copies included), then runs two
configurations, each on a fresh pinned ComfyUI of its own (so its peak RSS is its own; both servers
start together, then each runs its prompt while the other idles):

1. ``workflows/ltxv_tiny_t2v_int8.api.json``: "Load Checkpoint (INT8)" for the DiT and VAE, "Load Text
   Encoder (INT8)" for CLIP-L, Patch Attention and Free VRAM;
2. ``workflows/ltxv_tiny_t2v.api.json``: the stock checkpoint and CLIP loaders on the float files.

Same prompt, seed and size. Each run also saves its decoded frames as PNGs (a ``SaveImage`` node the
demo adds), which the frame PSNR between the two runs and the contact sheet are made from. Per run it
reports the model files it loads and their bytes, the server's peak RSS (the kernel's high-water mark
of the server process, from the pack's telemetry), the sampler's time (event stream) and the prompt's
time (submit → history). The MP4s, a run record beside each and the contact sheet land in ``out_dir``.

Example::

    outcome = run_demo(Path("leanvideo-out"), find_workspace())
    outcome.psnr_db, outcome.int8.model_bytes < outcome.stock.model_bytes, outcome.contact_sheet
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.errors import PortInUseError, PromptFailedError, WorkflowError
from runner.fixtures import write_fixtures
from runner.graph.workflow import Workflow, load_workflow
from runner.jobs.frames import psnr_db, read_frames, write_contact_sheet
from runner.jobs.models import ModelFile, check_models
from runner.local.ports import bind_error, pick_free_port
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import WORKFLOWS_DIR, Workspace
from runner.tracking.outputs import download_outputs
from runner.tracking.prompt import run_prompt
from runner.tracking.record import (
    build_run_record,
    collect_server_info,
    int8_kernels_measured,
    write_run_record,
)
from runner.tracking.result import PromptResult
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

DEMO_WORKFLOW = WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"  # the stock configuration
INT8_DEMO_WORKFLOW = WORKFLOWS_DIR / "ltxv_tiny_t2v_int8.api.json"
FRAMES_PREFIX = "leanvideo/demo_frames"
DEMO_USER_DIR = "demo-user"  # under the workspace's servers folder, shared by the demo's servers
FREE_VRAM_NODE = "LeanVideoFreeVRAM"

__all__ = [
    "CONFIGURATIONS",
    "DEMO_WORKFLOW",
    "INT8_DEMO_WORKFLOW",
    "DemoConfiguration",
    "DemoOutcome",
    "DemoRun",
    "add_frame_output",
    "load_workflow",
    "run_demo",
]


@dataclass(frozen=True)
class DemoConfiguration:
    """One column of the demo: a key for file names, a label for people, the workflow it runs."""

    key: str
    label: str
    workflow: Path


CONFIGURATIONS = (
    DemoConfiguration("int8", "LeanVideo INT8", INT8_DEMO_WORKFLOW),
    DemoConfiguration("stock", "stock ComfyUI", DEMO_WORKFLOW),
)


@dataclass(frozen=True)
class DemoRun:
    """What one configuration did on its own server."""

    configuration: DemoConfiguration
    model_files: tuple[ModelFile, ...]
    peak_rss_bytes: int | None
    server_ready_seconds: float
    result: PromptResult
    video: Path
    frames: tuple[Path, ...]
    record_path: Path
    kernels_measured: int = 0  # INT8 layer shapes whose kernels path=auto timed during this prompt

    @property
    def model_bytes(self) -> int:
        """Bytes of the model files the workflow loads."""
        return sum(file.bytes or 0 for file in self.model_files)

    @property
    def sampling_seconds(self) -> float:
        """The sampler node's time, from the event stream."""
        return self.result.phases["sampling"]

    @property
    def loading_seconds(self) -> float:
        """The loader nodes' time: reading the model files and building the models (the first INT8
        load in a process also imports the kernel libraries)."""
        return self.result.phases["model_load"]

    @property
    def release_seconds(self) -> float:
        """The Free VRAM nodes' time (garbage collection, cache and heap release); 0 without one."""
        return sum(n.seconds for n in self.result.nodes if n.class_type == FREE_VRAM_NODE and not n.cached)

    @property
    def prompt_seconds(self) -> float:
        """The whole prompt, submit → history entry, as the client saw it."""
        return self.result.wall_seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "configuration": self.configuration.key,
            "label": self.configuration.label,
            "workflow": str(self.configuration.workflow),
            "prompt_id": self.result.prompt_id,
            "model_files": [
                {"name": f.name, "folder": f.folder, "class_type": f.class_type, "bytes": f.bytes}
                for f in self.model_files
            ],
            "model_bytes": self.model_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "sampling_s": round(self.sampling_seconds, 6),
            "loading_s": round(self.loading_seconds, 6),
            "release_s": round(self.release_seconds, 6),
            "prompt_s": round(self.prompt_seconds, 6),
            "server_ready_s": round(self.server_ready_seconds, 3),
            "phases": self.result.phases,
            "video": str(self.video),
            "frames": [str(path) for path in self.frames],
            "record": str(self.record_path),
            "kernels_measured": self.kernels_measured,
        }


@dataclass(frozen=True)
class DemoOutcome:
    """Both runs, how close their frames are, the contact sheet and how long the demo took."""

    runs: tuple[DemoRun, ...]  # in CONFIGURATIONS order: INT8 first, then stock
    psnr_db: float
    contact_sheet: Path
    fixtures_seconds: float
    total_seconds: float

    @property
    def int8(self) -> DemoRun:
        return self.runs[0]

    @property
    def stock(self) -> DemoRun:
        return self.runs[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": [run.to_json() for run in self.runs],
            "frame_psnr_db": None if math.isinf(self.psnr_db) else self.psnr_db,  # None: identical
            "contact_sheet": str(self.contact_sheet),
            "fixtures_s": round(self.fixtures_seconds, 3),
            "total_s": round(self.total_seconds, 3),
        }


def add_frame_output(workflow: Workflow, prefix: str = FRAMES_PREFIX) -> tuple[Workflow, str]:
    """A copy of ``workflow`` that also saves its decoded frames as PNGs (lossless), and the id of the
    ``SaveImage`` node added. The workflow must have exactly one ``VAEDecode``."""
    decoders = [node_id for node_id, node in workflow.items() if node.get("class_type") == "VAEDecode"]
    if len(decoders) != 1:
        raise WorkflowError(f"the demo needs exactly one VAEDecode node, found {len(decoders)}: {decoders}")
    node_id = str(max((int(key) for key in workflow if key.isdigit()), default=0) + 1)
    saver = {
        "class_type": "SaveImage",
        "inputs": {"images": [decoders[0], 0], "filename_prefix": prefix},
        "_meta": {"title": "Save frames (PNG, lossless)"},
    }
    return {**workflow, node_id: saver}, node_id


def run_demo(
    out_dir: Path,
    workspace: Workspace,
    *,
    port: int | None = None,
    extra_args: tuple[str, ...] = (),
    timeout: float = 600.0,
) -> DemoOutcome:
    """Run both configurations and compare them; see the module docstring.

    ``port`` is the first server's port (the next ones take the ports after it; default: free ones).
    Both servers start together, then each runs its prompt alone while the other idles, and each is
    stopped as soon as its run is done.
    """
    began = time.monotonic()
    write_fixtures(
        workspace.models_dir,
        workspace.comfyui_dir,
        python=workspace.python,
        searched_first=workspace.user_models_dir,  # a model of yours there would run under a tiny one's name
        searched_extra=workspace.extra_model_folders,
    )
    fixtures_seconds = time.monotonic() - began
    # a run's own suffix: two demos started in the same second into one --out keep their files apart
    stamp = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    workflows = [_prepare(configuration, workspace) for configuration in CONFIGURATIONS]
    ports = _ports(port, len(CONFIGURATIONS))
    workspace.servers_dir.mkdir(parents=True, exist_ok=True)
    args = _server_args(workspace, extra_args)
    with contextlib.ExitStack() as cleanup:
        # The servers start in parallel from these threads, which must outlive them: a server dies
        # with the thread that started it (PR_SET_PDEATHSIG). Callbacks run last-in first-out, so the
        # servers are stopped before the threads end.
        pool = cleanup.enter_context(ThreadPoolExecutor(len(ports)))
        servers = []
        for server_port in ports:
            state_dir = Path(tempfile.mkdtemp(prefix="demo-", dir=workspace.servers_dir))
            cleanup.callback(shutil.rmtree, state_dir, ignore_errors=True)
            server = ComfyServer(
                ServerConfig.in_workspace(workspace, state_dir, port=server_port, extra_args=args)
            )
            cleanup.callback(server.stop)
            servers.append(server)
        ready_seconds = list(pool.map(_start, servers))
        runs = []
        for configuration, prepared, server, ready in zip(
            CONFIGURATIONS, workflows, servers, ready_seconds, strict=True
        ):
            name = f"demo-{stamp}-{configuration.key}"
            runs.append(_run_on(server, configuration, prepared, out_dir, name, ready, timeout))
            server.stop()  # its memory goes back before the next configuration runs
    frames = [read_frames(run.frames) for run in runs]
    sheet = write_contact_sheet(
        [(_sheet_label(run), run_frames) for run, run_frames in zip(runs, frames, strict=True)],
        out_dir / f"demo-{stamp}-contact-sheet.png",
    )
    return DemoOutcome(
        runs=tuple(runs),
        psnr_db=psnr_db(frames[1], frames[0]),
        contact_sheet=sheet,
        fixtures_seconds=fixtures_seconds,
        total_seconds=time.monotonic() - began,
    )


@dataclass(frozen=True)
class _Prepared:
    workflow: Workflow
    frames_node: str
    model_files: tuple[ModelFile, ...]


def _prepare(configuration: DemoConfiguration, workspace: Workspace) -> _Prepared:
    """The workflow to submit (with its PNG frame output) and the model files it loads, all present."""
    models = check_models(configuration.workflow, workspace.models_dir, templates={})
    missing = [file.name for file in models.files if file.status == "missing"]
    if missing:
        raise WorkflowError(
            f"{configuration.workflow}: model files missing in {workspace.models_dir}: {missing}"
        )
    if damaged := [f"{file.path}: {file.hint}" for file in models.files if file.status == "invalid"]:
        raise WorkflowError(f"{configuration.workflow}: model files that cannot load: {'; '.join(damaged)}")
    workflow, frames_node = add_frame_output(load_workflow(configuration.workflow))
    return _Prepared(workflow, frames_node, tuple(models.files))


def _ports(first: int | None, count: int) -> list[int]:
    """``--port P``: P and the ports after it, each checked free first (a busy P+1 was said as if the
    user had asked for it); else free ones."""
    if first is not None:  # (argparse keeps P + count - 1 within the port range)
        asked = [first + index for index in range(count)]
        for port in asked:
            if (error := bind_error("127.0.0.1", port)) is not None:
                raise PortInUseError(
                    f"--port {first}: the demo runs its {count} servers on ports {asked[0]}–{asked[-1]}, and "
                    f"port {port}: {(error.strerror or str(error)).lower()}; pass another --port"
                )
        return asked
    ports: list[int] = []
    while len(ports) < count:
        if (candidate := pick_free_port()) not in ports:
            ports.append(candidate)
    return ports


def _server_args(workspace: Workspace, extra_args: tuple[str, ...]) -> tuple[str, ...]:
    """ComfyUI flags of the demo servers: a user directory they share and keep (the INT8 loaders'
    measured kernel table lives there, so a second demo does not measure again), then the caller's."""
    if "--user-directory" in extra_args:
        return extra_args
    user_dir = workspace.servers_dir / DEMO_USER_DIR
    user_dir.mkdir(parents=True, exist_ok=True)
    return ("--user-directory", str(user_dir), *extra_args)


def _start(server: ComfyServer) -> float:
    started = time.monotonic()
    server.start()
    return time.monotonic() - started


def _sheet_label(run: DemoRun) -> str:
    return f"{run.configuration.label}\n{run.model_bytes / 1e6:.0f} MB models"


def _run_on(
    server: ComfyServer,
    configuration: DemoConfiguration,
    prepared: _Prepared,
    out_dir: Path,
    name: str,
    ready_seconds: float,
    timeout: float,
) -> DemoRun:
    """Run one configuration on its own server; its files are named ``name…`` in ``out_dir``."""
    with ComfyClient(server.url) as client:
        server_info = collect_server_info(
            client.get_json("/system_stats"), client.get_json("/leanvideo/info", missing_ok=True)
        )
        result = run_prompt(client, prepared.workflow, timeout=timeout)
        telemetry = client.read_telemetry(result.prompt_id)
        snapshot = client.get_json("/leanvideo/telemetry", missing_ok=True) or {}
        outputs = dict(result.outputs)
        frame_outputs = {prepared.frames_node: outputs.pop(prepared.frames_node, {})}
        files = download_outputs(client, outputs, out_dir, prefix=f"{name}-")
        frame_files = download_outputs(client, frame_outputs, out_dir / f"{name}-frames")
    videos = [f.path for f in files if f.path.suffix in {".mp4", ".webm"}]
    frames = tuple(sorted(f.path for f in frame_files if f.path.suffix == ".png"))
    if not videos or not frames:
        raise PromptFailedError(f"prompt {result.prompt_id} finished without a video and its PNG frames")
    record = build_run_record(
        result,
        prepared.workflow,
        configuration.workflow,
        server_info,
        [*files, *frame_files],
        telemetry=telemetry,
    )
    peak = (snapshot.get("process") or {}).get("peak_rss_bytes")
    return DemoRun(
        configuration=configuration,
        model_files=prepared.model_files,
        peak_rss_bytes=peak if isinstance(peak, int) else None,
        server_ready_seconds=ready_seconds,
        result=result,
        video=videos[0],
        frames=frames,
        record_path=write_run_record(record, videos[0].with_suffix(".json")),
        kernels_measured=int8_kernels_measured(telemetry),
    )
