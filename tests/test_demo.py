"""The demo end to end on real pinned servers: the tiny LTXV through LeanVideo's INT8 nodes and through
stock ComfyUI, each on its own server; both videos decode, the figures of both columns are there and
sane, the frames agree (lossless PSNR), the contact sheet is a PNG of the expected size."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import pytest
from PIL import Image

from runner.errors import WorkflowError
from runner.jobs.demo import DEMO_WORKFLOW, INT8_DEMO_WORKFLOW, DemoOutcome, load_workflow, run_demo
from runner.jobs.frames import contact_sheet_size
from runner.local.workspace import Workspace
from tests.scratch import scratch_dir

pytestmark = pytest.mark.integration

# INT8 DiT + INT8 CLIP-L against the float files: measured 44.2 dB on the tiny model (printed below)
MIN_PSNR_DB = 35.0
INT8_NODES = {
    "LeanVideoCheckpointLoaderINT8",
    "LeanVideoTextEncoderLoaderINT8",
    "LeanVideoPatchAttention",
    "LeanVideoFreeVRAM",
}


def _decode(path: Path) -> tuple[int, int, int]:
    with av.open(str(path)) as container:
        frames = [frame for frame in container.decode(video=0)]
    return len(frames), frames[0].width, frames[0].height


@pytest.fixture(scope="module")
def outcome(workspace: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoOutcome]:
    with scratch_dir(tmp_path_factory, "demo") as root:
        yield run_demo(root / "out", workspace)


def test_demo_runs_our_nodes_then_stock_comfyui(outcome: DemoOutcome) -> None:
    int8, stock = outcome.int8, outcome.stock
    assert (int8.configuration.workflow, stock.configuration.workflow) == (INT8_DEMO_WORKFLOW, DEMO_WORKFLOW)
    latent = next(
        n["inputs"]
        for n in load_workflow(DEMO_WORKFLOW).values()
        if n["class_type"] == "EmptyLTXVLatentVideo"
    )
    for run in outcome.runs:
        assert _decode(run.video) == (latent["length"], latent["width"], latent["height"])
        assert len(run.frames) == latent["length"]
        record = json.loads(run.record_path.read_text())
        assert record["schema"] == "leanvideo.run" and record["status"] == "success"
        assert record["environment"]["comfyui_version"] == "0.3.75"
        assert record["telemetry"]["available"] is True
        timed = {node["class_type"] for node in record["nodes"] if not node["cached"]}
        assert {"SamplerCustom", "VAEDecode", "SaveVideo", "SaveImage"} <= timed
        assert timed & INT8_NODES == (INT8_NODES if run is int8 else set()), run.configuration.key
    assert int8.result.prompt_id != stock.result.prompt_id


def test_both_columns_have_sane_figures(outcome: DemoOutcome) -> None:
    int8, stock = outcome.int8, outcome.stock
    print(
        f"model bytes {int8.model_bytes} vs {stock.model_bytes}; peak RSS {int8.peak_rss_bytes} vs "
        f"{stock.peak_rss_bytes}; sampling {int8.sampling_seconds:.3f} vs {stock.sampling_seconds:.3f} s; "
        f"prompt {int8.prompt_seconds:.3f} vs {stock.prompt_seconds:.3f} s; PSNR {outcome.psnr_db:.2f} dB; "
        f"demo {outcome.total_seconds:.1f} s"
    )
    assert [f.name for f in int8.model_files] == ["ltxv-tiny-int8.safetensors", "clip_l-int8.safetensors"]
    assert [f.name for f in stock.model_files] == ["ltxv-tiny.safetensors", "clip_l.safetensors"]
    assert 0 < int8.model_bytes < stock.model_bytes
    for run in outcome.runs:
        assert run.peak_rss_bytes is not None and run.peak_rss_bytes > 300 * 2**20  # a whole ComfyUI
        assert 0 < run.sampling_seconds < run.prompt_seconds
        assert 0 < run.loading_seconds < run.prompt_seconds
    assert int8.release_seconds > 0 and stock.release_seconds == 0  # only our graph has Free VRAM
    assert math.isfinite(outcome.psnr_db) and outcome.psnr_db >= MIN_PSNR_DB
    figures = json.loads(json.dumps(outcome.to_json()))  # JSON all the way down
    assert [run["configuration"] for run in figures["runs"]] == ["int8", "stock"]
    assert figures["frame_psnr_db"] == outcome.psnr_db
    assert {"model_bytes", "peak_rss_bytes", "sampling_s", "loading_s", "release_s", "prompt_s"} <= set(
        figures["runs"][0]
    )


def test_contact_sheet_is_a_png_of_both_rows(outcome: DemoOutcome) -> None:
    assert outcome.contact_sheet.parent == outcome.int8.video.parent
    with Image.open(outcome.contact_sheet) as sheet:
        assert sheet.format == "PNG"
        assert sheet.size == contact_sheet_size(9, 64, 64, rows=2)


def test_demo_cli_prints_both_columns(workspace: Workspace, tmp_path: Path) -> None:
    out = tmp_path / "cli-out"
    # A user directory of its own: no kernel table yet, so the INT8 run measures and says so
    (tmp_path / "user").mkdir()
    user = ("--user-directory", str(tmp_path / "user"))
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "demo", "--out", str(out), "--", *user],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    for text in ("LeanVideo INT8", "stock ComfyUI", "model file bytes", "peak RSS", "sampling", "frame PSNR"):
        assert text in done.stdout, text
    videos = sorted(out.glob("*.mp4"))
    assert len(videos) == 2 and all(video.with_suffix(".json").is_file() for video in videos)
    assert "note: the INT8 run timed its kernels for" in done.stdout.replace("\n", " ")
    assert (tmp_path / "user" / "leanvideo" / "int8_kernels.json").is_file()
    sheets = sorted(out.glob("*contact-sheet.png"))
    assert len(sheets) == 1 and f"contact sheet: {sheets[0]}" in done.stdout.replace("\n", "")


def test_load_workflow_names_the_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(WorkflowError, match=r"broken\.json"):
        load_workflow(bad)
    ui = tmp_path / "ui.json"
    ui.write_text(json.dumps({"nodes": [], "links": []}))
    with pytest.raises(WorkflowError, match="not in API format"):
        load_workflow(ui)


def test_a_busy_second_port_is_said_as_the_demos_own() -> None:
    """``--port P`` runs the servers on P and P+1: a busy P+1 was said as if the user had asked for it."""
    import socket

    from runner.errors import PortInUseError
    from runner.jobs.demo import _ports
    from runner.local.ports import bind_error

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        if bind_error("127.0.0.1", taken - 1) is not None:
            pytest.skip(f"port {taken - 1} is in use by something else right now")
        with pytest.raises(PortInUseError) as refused:
            _ports(taken - 1, 2)
    said = str(refused.value)
    assert said.startswith(f"--port {taken - 1}: the demo runs its 2 servers on ports {taken - 1}–{taken}")
    assert f"port {taken}: address already in use" in said and refused.value.exit_code == 2
