"""The demo end to end on the real pinned server: an MP4 that decodes, a run record, a timing table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import av
import pytest

from runner.errors import WorkflowError
from runner.jobs.demo import DEMO_WORKFLOW, load_workflow, run_demo
from runner.local.workspace import Workspace

pytestmark = pytest.mark.integration


def _decode(path: Path) -> tuple[int, int, int]:
    with av.open(str(path)) as container:
        frames = [frame for frame in container.decode(video=0)]
    return len(frames), frames[0].width, frames[0].height


def test_demo_writes_a_playable_video_and_a_record(workspace: Workspace, tmp_path: Path) -> None:
    outcome = run_demo(tmp_path / "out", workspace)
    workflow = load_workflow(DEMO_WORKFLOW)
    latent = next(n["inputs"] for n in workflow.values() if n["class_type"] == "EmptyLTXVLatentVideo")
    assert outcome.video.suffix == ".mp4"
    assert _decode(outcome.video) == (latent["length"], latent["width"], latent["height"])
    record = json.loads(outcome.record_path.read_text())
    assert record["schema"] == "leanvideo.run" and record["version"] == 2
    assert record["status"] == "success"
    assert record["environment"]["comfyui_version"] == "0.3.75"
    timed = {node["class_type"] for node in record["nodes"] if not node["cached"]}
    assert {"SamplerCustom", "VAEDecode", "SaveVideo"} <= timed
    sampler = next(node for node in record["nodes"] if node["class_type"] == "SamplerCustom")
    assert sampler["seconds"] > 0 and sampler["steps"] is not None
    assert record["outputs"][0]["path"] == str(outcome.video)
    assert record["outputs"][0]["bytes"] == outcome.video.stat().st_size


def test_demo_cli_prints_the_table_and_paths(workspace: Workspace, tmp_path: Path) -> None:
    out = tmp_path / "cli-out"
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SamplerCustom" in done.stdout and "time per node" in done.stdout
    videos = sorted(out.glob("*.mp4"))
    assert len(videos) == 1
    assert f"video:  {videos[0]}" in done.stdout.replace("\n", "")
    assert videos[0].with_suffix(".json").is_file()


def test_load_workflow_names_the_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(WorkflowError, match=r"broken\.json"):
        load_workflow(bad)
    ui = tmp_path / "ui.json"
    ui.write_text(json.dumps({"nodes": [], "links": []}))
    with pytest.raises(WorkflowError, match="not in API format"):
        load_workflow(ui)
