"""`leanvideo run` / `leanvideo workflow validate` against the real pinned server with the tiny models."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.cli.main import main
from runner.errors import PromptCancelledError, WorkflowError
from runner.jobs.demo import DEMO_WORKFLOW
from runner.jobs.run import RunOptions, run_workflow
from runner.local.server import ComfyServer
from runner.tracking.events import ClientEvent

pytestmark = pytest.mark.integration


def fresh_seed() -> int:
    """A seed no earlier run of the shared server used, so nothing is served from its cache."""
    return random.SystemRandom().randrange(10**6, 10**12)


def options(server: ComfyServer, out: Path, *sets: str, **kwargs: Any) -> RunOptions:
    return RunOptions(server=server.url, out_dir=out, overrides=sets, timeout=120, **kwargs)


def write_workflow(tmp_path: Path, workflow: dict[str, Any], name: str = "wf.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(workflow))
    return path


def test_run_with_overrides_writes_a_complete_record(comfy_server: ComfyServer, tmp_path: Path) -> None:
    seed = fresh_seed()
    events: list[ClientEvent] = []
    outcome = run_workflow(
        DEMO_WORKFLOW,
        options(comfy_server, tmp_path, f"Sample.noise_seed={seed}", "9.steps=4"),
        events.append,
    )
    record = outcome.record
    assert record["schema"] == "leanvideo.run" and record["version"] == 2 and not record["partial"]
    assert record["status"] == "success" and record["error"] is None
    assert record["prompt_id"] == outcome.result.prompt_id
    assert record["seeds"] == {"11.noise_seed": seed}
    assert [(o["node_id"], o["input_name"], o["value"]) for o in record["overrides"]] == [
        ("11", "noise_seed", seed),
        ("9", "steps", 4),
    ]
    assert record["workflow"]["file_sha256"] == hashlib.sha256(DEMO_WORKFLOW.read_bytes()).hexdigest()
    environment = record["environment"]
    assert environment["comfyui_version"] == "0.3.75" and "--cpu" in environment["comfyui_argv"]
    assert environment["pytorch_version"] and environment["device"]["type"] == "cpu"
    assert environment["leanvideo_version"] and environment["runner_version"]
    assert environment["server_url"] == comfy_server.url  # which server ran it
    timing = record["timing"]
    assert 0 < timing["server_execution_s"] <= timing["wall_s"]
    assert timing["phases"]["sampling"] > 0 and timing["phases"]["vae_decode"] > 0
    sampler = next(node for node in record["nodes"] if node["node_id"] == "11")
    assert sampler["steps"] == 4 and len(sampler["step_seconds"]) == 4 and not sampler["cached"]
    assert sum(event.kind == "step" for event in events) == 4 and events[-1].kind == "done"
    assert "available" in record["telemetry"]
    (video,) = record["outputs"]
    path = Path(video["path"])
    assert path.parent == outcome.record_path.parent and path.name == video["server_name"]
    assert (
        video["bytes"] == path.stat().st_size
        and video["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    )
    assert (video["video"]["frames"], video["video"]["width"], video["video"]["fps"]) == (9, 64, 24.0)


def test_an_identical_rerun_is_served_from_the_cache(comfy_server: ComfyServer, tmp_path: Path) -> None:
    run = options(comfy_server, tmp_path, f"11.noise_seed={fresh_seed()}", "9.steps=2")
    first = run_workflow(DEMO_WORKFLOW, run)
    second = run_workflow(DEMO_WORKFLOW, run)
    assert not all(node["cached"] for node in first.record["nodes"])
    assert second.record["status"] == "success"
    assert all(node["cached"] for node in second.record["nodes"]) and len(second.record["nodes"]) == 14
    assert second.record["timing"]["phases"]["sampling"] == 0.0
    assert second.record_path.parent != first.record_path.parent  # a folder per run: nothing overwritten
    assert second.files[0].sha256 == first.files[0].sha256  # the cached output is the same file


def test_an_editor_file_runs_as_the_editor_would_submit_it(comfy_server: ComfyServer, tmp_path: Path) -> None:
    """`leanvideo run X.ui.json`: converted with the server's /object_info, as `workflow validate` and
    `workflow diff` take editor files; the overrides apply to the converted graph."""
    seed = fresh_seed()
    ui = DEMO_WORKFLOW.with_name(DEMO_WORKFLOW.name.replace(".api.json", ".ui.json"))
    outcome = run_workflow(ui, options(comfy_server, tmp_path, f"Sample.noise_seed={seed}", "9.steps=2"))
    assert outcome.record["status"] == "success" and outcome.record["seeds"] == {"11.noise_seed": seed}
    assert outcome.record["workflow"]["file_sha256"] == hashlib.sha256(ui.read_bytes()).hexdigest()
    sampler = next(node for node in outcome.record["nodes"] if node["node_id"] == "11")
    assert sampler["steps"] == 2
    broken = write_workflow(tmp_path, {"nodes": [{"id": 1, "type": "NoSuchNode"}], "links": []}, "b.ui.json")
    with pytest.raises(WorkflowError, match=r"b\.ui\.json: .*NoSuchNode"):
        run_workflow(broken, options(comfy_server, tmp_path))


def test_validation_errors_name_the_node_client_side_and_server_side(
    comfy_server: ComfyServer, tiny_workflow: dict[str, Any], tmp_path: Path
) -> None:
    tiny_workflow["1"]["inputs"]["ckpt_name"] = "no-such-model.safetensors"
    path = write_workflow(tmp_path, tiny_workflow)
    with pytest.raises(
        WorkflowError, match=r"node 1 \(CheckpointLoaderSimple\) input 'ckpt_name': model file"
    ):
        run_workflow(path, options(comfy_server, tmp_path / "a"))
    with pytest.raises(WorkflowError, match=r"node 1 \(CheckpointLoaderSimple\) input 'ckpt_name'"):
        run_workflow(path, options(comfy_server, tmp_path / "b", validate=False))
    with pytest.raises(WorkflowError, match=r"close matches: .*Sample"):
        run_workflow(DEMO_WORKFLOW, options(comfy_server, tmp_path / "c", "Sampel.noise_seed=1"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_unusable_out_folder_exits_2_before_anything_is_submitted(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("kept")
    before = httpx.get(f"{comfy_server.url}/history").json()
    code = main(["run", str(DEMO_WORKFLOW), "--server", comfy_server.url, "--out", str(taken), "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and (error["type"], error["exit_code"]) == ("UsageError", 2)
    assert error["message"] == f"--out {taken}: {taken} is a file, not a folder"
    assert httpx.get(f"{comfy_server.url}/history").json() == before and taken.read_text() == "kept"
    code = main(["run", str(DEMO_WORKFLOW), "--server", comfy_server.url, "--set", "Sampel.seed=1", "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 5 and error["type"] == "WorkflowError" and "Sampel" in error["message"]


def test_ctrl_c_interrupts_the_prompt_on_the_server(comfy_server: ComfyServer, tmp_path: Path) -> None:
    def press_ctrl_c_on_first_step(event: ClientEvent) -> None:
        if event.kind == "step":
            raise KeyboardInterrupt

    run = options(comfy_server, tmp_path, f"11.noise_seed={fresh_seed()}", "9.steps=400")
    with pytest.raises(PromptCancelledError) as caught:
        run_workflow(DEMO_WORKFLOW, run, press_ctrl_c_on_first_step)
    prompt_id = caught.value.result.prompt_id
    record = json.loads(Path(caught.value.record_path).read_text())
    assert record["partial"] and record["status"] == "cancelled" and record["prompt_id"] == prompt_id
    assert record["outputs"] == []
    assert (record["error"]["node_id"], record["error"]["class_type"]) == ("11", "SamplerCustom")
    entry = httpx.get(f"{comfy_server.url}/history/{prompt_id}").json()[prompt_id]
    assert "execution_interrupted" in [kind for kind, _ in entry["status"]["messages"]]
    queue = httpx.get(f"{comfy_server.url}/queue").json()
    assert queue["queue_running"] == [] and queue["queue_pending"] == []


def test_cli_run_prints_node_and_step_times(
    comfy_server: ComfyServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "out"
    code = main(
        ["run", str(DEMO_WORKFLOW), "--server", comfy_server.url, "--set", "9.steps=3", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "SamplerCustom" in printed and "step times of node 11 (s; the first holds the set-up):" in printed
    assert "server execution window" in printed and "9 frames 64×64" in printed
    (record_path,) = out.glob("*/run.json")
    assert f"record: {record_path}" in printed

    code = main(["run", str(DEMO_WORKFLOW), "--server", comfy_server.url, "--json", "--out", str(out)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["status"] == "success" and record["outputs"][0]["video"]["frames"] == 9

    # an editor file, with the live progress (its node count comes from the converted prompt)
    ui = DEMO_WORKFLOW.with_name(DEMO_WORKFLOW.name.replace(".api.json", ".ui.json"))
    seed = f"Sample.noise_seed={fresh_seed()}"
    code = main(["run", str(ui), "--server", comfy_server.url, "--set", seed, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "nodes: done" in captured.err and "14/14" in captured.err and "SamplerCustom" in captured.out
    # a missing file is the workflow's fault (exit 5), said before any server is asked
    code = main(["run", str(tmp_path / "nope.json"), "--server", "http://127.0.0.1:9", "--out", str(out)])
    assert code == 5 and "nope.json" in capsys.readouterr().err


def test_cli_workflow_validate(
    comfy_server: ComfyServer,
    tiny_workflow: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["workflow", "validate", str(DEMO_WORKFLOW), "--server", comfy_server.url]) == 0
    assert "valid (0 error(s)" in capsys.readouterr().out
    editor_file = DEMO_WORKFLOW.with_name(DEMO_WORKFLOW.name.replace(".api.json", ".ui.json"))
    assert main(["workflow", "validate", str(editor_file), "--server", comfy_server.url]) == 0  # converted
    assert "valid (0 error(s)" in capsys.readouterr().out
    tiny_workflow["2"]["inputs"]["clip_name"] = "t5xxl.safetensors"
    tiny_workflow["9"]["inputs"]["steps"] = 0
    tiny_workflow["13"]["class_type"] = "CreateVide"
    del tiny_workflow["14"]["inputs"]["format"]
    path = write_workflow(tmp_path, tiny_workflow)
    assert main(["workflow", "validate", str(path), "--server", comfy_server.url, "--json"]) == 5
    found = json.loads(capsys.readouterr().out)
    assert not found["valid"]
    where = {(p["node_id"], p["input"]) for p in found["problems"]}
    assert {("2", "clip_name"), ("9", "steps"), ("13", None), ("14", "format")} <= where


def _ignore_sigint() -> None:  # as a script's `leanvideo run … &` starts: SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("signals", "background"),
    [
        ((signal.SIGINT,), False),
        ((signal.SIGTERM,), False),  # timeout(1), CI runners, docker, systemd
        ((signal.SIGINT,), True),  # kill -INT of a command a script started in the background
        ((signal.SIGINT, signal.SIGINT), False),  # Ctrl-C twice: the second must not cut the cleanup short
        ((signal.SIGHUP,), False),  # the ssh session went away
    ],
    ids=["ctrl-c", "sigterm", "background-kill-int", "ctrl-c-twice", "sighup"],
)
def test_a_signal_to_the_cli_stops_the_job_and_exits_130(
    comfy_server: ComfyServer, tmp_path: Path, signals: tuple[int, ...], background: bool
) -> None:
    command = [
        sys.executable,
        "-m",
        "runner.cli.main",
        "run",
        str(DEMO_WORKFLOW),
        "--server",
        comfy_server.url,
    ]
    command += ["--set", f"11.noise_seed={fresh_seed()}", "--set", "9.steps=3000", "--out", str(tmp_path)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ,
        preexec_fn=_ignore_sigint if background else None,
    )
    try:
        deadline = time.monotonic() + 60
        while not httpx.get(f"{comfy_server.url}/queue").json()["queue_running"]:
            assert time.monotonic() < deadline and process.poll() is None, process.communicate()
            time.sleep(0.05)
        time.sleep(0.3)
        for number in signals:
            process.send_signal(number)
            time.sleep(0.05)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert "cancelled" in err and "partial run record" in err
    assert "interrupted: prompt" in err and "error:" not in err  # the user's doing, not an error
    queue = httpx.get(f"{comfy_server.url}/queue").json()
    assert queue["queue_running"] == [] and queue["queue_pending"] == []
    [record] = tmp_path.glob("*/run.json")  # the partial record is written, whatever stopped the run
    assert json.loads(record.read_text(encoding="utf-8"))["status"] == "cancelled"


def test_a_prompt_that_fails_on_the_server_exits_6_with_its_whole_record(
    comfy_server: ComfyServer,
    tiny_models: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A damaged checkpoint fails in its loader: the record is the server's whole account, so it is
    said as the run record, not a partial one."""
    junk = tiny_models.checkpoint.parent / "test-damaged.safetensors"
    junk.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    out = tmp_path / "out"
    try:
        code = main(
            [
                *("run", str(DEMO_WORKFLOW), "--server", comfy_server.url, "--out", str(out)),
                *("--set", f"1.ckpt_name={junk.name}"),
            ]
        )
    finally:
        junk.unlink()
    err = " ".join(capsys.readouterr().err.split())
    (record_path,) = out.glob("*/run.json")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    assert code == 6, err
    assert record["status"] == "error" and record["partial"] is False
    assert record["error"]["node_id"] == "1" and record["error"]["class_type"] == "CheckpointLoaderSimple"
    assert f"run record: {record_path}" in err and "partial run record" not in err


@pytest.mark.parametrize("stderr_too", [False, True])
def test_a_reader_of_the_output_that_goes_away_cancels_the_prompt_and_keeps_its_record(
    comfy_server: ComfyServer, tmp_path: Path, stderr_too: bool
) -> None:
    """`leanvideo run … 2>&1 | head -1`: the progress line that finds the pipe closed stops the run as
    Ctrl-C does (the prompt is taken off the server, the partial record written), with SIGPIPE's exit;
    with stdout alone closed, the summary at the end finds it so (the prompt has finished by then)."""
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            *(
                sys.executable,
                "-m",
                "runner.cli.main",
                "run",
                str(DEMO_WORKFLOW),
                "--server",
                comfy_server.url,
            ),
            *("--out", str(out), "--set", f"9.steps={10000 if stderr_too else 2}"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader went away before the first line
    process.stdout = None
    _, err = process.communicate(timeout=240)
    assert process.returncode == 141, err
    assert "Traceback" not in (err or "")
    (record_path,) = out.glob("*/run.json")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    assert record["status"] == ("cancelled" if stderr_too else "success")
    assert record["partial"] is stderr_too
    queue = httpx.get(f"{comfy_server.url}/queue", timeout=30).json()
    assert not queue["queue_running"] and not queue["queue_pending"]


def test_an_image_comfyui_saved_is_read_as_the_workflow_that_made_it(
    comfy_server: ComfyServer,
    tiny_workflow: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A PNG given as the workflow was "not UTF-8 text (byte 0)"; ComfyUI writes the workflow into it."""
    tiny_workflow["11"]["inputs"]["noise_seed"] = fresh_seed()
    tiny_workflow["14"] = {
        "class_type": "SaveImage",
        "inputs": {"images": ["12", 0], "filename_prefix": "png"},
    }
    path = write_workflow(tmp_path, tiny_workflow, "wf.api.json")
    assert (
        main(["run", str(path), "--server", comfy_server.url, "--out", str(tmp_path / "ran"), "--json"]) == 0
    )
    record = json.loads(capsys.readouterr().out)
    png = next(Path(f["path"]) for f in record["outputs"] if str(f["path"]).endswith(".png"))
    assert main(["workflow", "diff", str(png), str(path)]) == 0, capsys.readouterr().out
    assert main(["workflow", "validate", str(png), "--server", comfy_server.url]) == 0
    png.write_bytes(png.read_bytes()[:60])  # cut inside its first chunk
    assert main(["workflow", "diff", str(png), str(path)]) == 5
    assert f"workflow file {png} is a PNG image that cannot be read" in capsys.readouterr().err
