"""A LoRA the server applies to nothing (another model's keys, another size) is said by `leanvideo run`
and kept in the run record's telemetry: ComfyUI logs it in its own log only, and the prompt succeeds
with frames made without it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from leanvideo.int8.files import read_tensors
from leanvideo.lora_notes import why_not_applied
from safetensors.torch import save_file

from runner.cli.main import main
from runner.fixtures import FixtureSet
from runner.local.server import ComfyServer

NOT_LOADED = "no layer of the model has its key (a LoRA of another model?)"
NOT_FITTING = "its factors do not fit their layer (a LoRA of another model or size?)"


def test_comfyuis_lines_for_lora_weights_left_out_are_told_apart() -> None:
    assert why_not_applied("lora key not loaded: blocks.0.self_attn.q.lora_A.weight") == NOT_LOADED
    assert why_not_applied("ERROR lora diffusion_model.x.weight shape '[64, 64]' is invalid") == NOT_FITTING
    assert why_not_applied("ERROR lokr diffusion_model.x.weight boom") == NOT_FITTING
    assert why_not_applied("WARNING SHAPE MISMATCH x WEIGHT NOT MERGED [2] != [3]") == NOT_FITTING
    assert why_not_applied("Calculate Weight Failed: lora x") == "its weight could not be computed"
    assert why_not_applied("ERROR something else happened") is None
    assert why_not_applied("Requested to load LTXV") is None


def _another_models_lora(place: Callable[[str], Path], name: str) -> str:
    """Write a LoRA of three Wan keys (no layer of the tiny LTXV has them) as ``loras/NAME.safetensors``;
    returns its file name."""
    lora = {f"diffusion_model.blocks.{i}.self_attn.q.lora_A.weight": torch.zeros(8, 64) for i in range(3)}
    save_file(lora, str(place(f"loras/{name}.safetensors")))
    return f"{name}.safetensors"


def _with_lora(workflow: dict[str, Any], lora_name: str, mode: str) -> dict[str, Any]:
    """``workflow`` (the tiny LTXV) sampling through the INT8 diffusion-model loader and ``lora_name``."""
    workflow["20"] = {
        "class_type": "LeanVideoDiffusionModelLoaderINT8",
        "inputs": {"unet_name": "ltxv-tiny-dit.safetensors", "compute_dtype": "default", "path": "auto",
                   "quantize_on_load": True, "convrot": False, "lora_mode": mode},
    }  # fmt: skip
    workflow["21"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {"model": ["20", 0], "lora_name": lora_name, "strength_model": 1.0},
    }
    workflow["11"]["inputs"]["model"] = ["21", 0]
    return workflow


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["merge", "side_branch"])
def test_a_lora_of_another_model_is_said_after_the_run(
    mode: str,
    comfy_server: ComfyServer,
    placed: Callable[[str], Path],
    tiny_models: FixtureSet,
    tiny_workflow: dict[str, Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Twice the size (its factors fit no layer) and under Wan's keys (none loads): exit 0 and frames
    without it, said only in comfyui.log. The fitting LoRA is said nothing of."""
    assert tiny_models.diffusion_model.name == "ltxv-tiny-dit.safetensors"
    lora = read_tensors(tiny_models.lora)
    wider = {key: torch.zeros(*(2 * n for n in t.shape)) for key, t in lora.items()}
    save_file(wider, str(placed(f"loras/test-notes-wider-{mode}.safetensors")))
    _another_models_lora(placed, f"test-notes-wan-{mode}")
    said: dict[str, str] = {}
    for name in (f"test-notes-wider-{mode}", f"test-notes-wan-{mode}", tiny_models.lora.stem):
        workflow = _with_lora(json.loads(json.dumps(tiny_workflow)), f"{name}.safetensors", mode)
        workflow["11"]["inputs"]["noise_seed"] = hash((name, mode)) % 10**9  # not from the cache
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(workflow))
        out = tmp_path / name
        caplog.clear()
        assert main(["run", str(path), "--server", comfy_server.url, "--out", str(out)]) == 0
        said[name] = caplog.text
        last = capsys.readouterr().err.strip().splitlines()[-1]  # below the tables, where it is read
        assert last.startswith("warning: the server applied") == (name != tiny_models.lora.stem), last
        (record,) = out.glob("*/run.json")
        events = json.loads(record.read_text())["telemetry"]["events"]
        noted = [e for e in events if e["kind"] == "lora_not_applied"]
        if name == tiny_models.lora.stem:
            assert noted == [] and "to nothing" not in said[name]
        else:
            (event,) = noted
            assert event["key"] == (NOT_FITTING if "wider" in name else NOT_LOADED)
            assert event["calls"] >= 3
    assert "LoRA weight(s) to nothing: its factors do not fit their layer" in said[f"test-notes-wider-{mode}"]
    assert (
        "the server applied 3 LoRA weight(s) to nothing: no layer of the model has its key (a LoRA of "
        "another model?); the first: 'lora key not loaded: diffusion_model.blocks."
    ) in said[f"test-notes-wan-{mode}"]


@pytest.mark.browser
def test_the_editor_that_queued_the_prompt_is_told_a_lora_did_nothing(
    comfy_server: ComfyServer, placed: Callable[[str], Path], tiny_workflow: dict[str, Any]
) -> None:
    """An artist saw frames without the LoRA and no word of it: ComfyUI says so in its log only."""
    import httpx

    from tests.browser import open_app

    httpx.post(f"{comfy_server.url}/settings/Comfy.TutorialCompleted", json=True, timeout=30)
    _another_models_lora(placed, "test-notes-wan-editor")
    workflow = _with_lora(tiny_workflow, "test-notes-wan-editor.safetensors", "merge")
    workflow["11"]["inputs"]["noise_seed"] = 424242  # not from the cache
    toast = ".p-toast-message"
    with open_app(comfy_server.url) as page:
        page.evaluate("async (api) => { await window.app.loadApiJson(api, 'lora.json'); }", workflow)
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        page.wait_for_selector(f"{toast}:has-text('a LoRA did nothing')", timeout=240_000)
        said = page.inner_text(toast)
    assert "applied to nothing: no layer of the model has its key (a LoRA of another model?)" in said
    assert "lora key not loaded: diffusion_model.blocks." in said


@pytest.mark.integration
def test_a_batch_jobs_record_keeps_what_its_lora_did_not_do(
    comfy_server: ComfyServer,
    placed: Callable[[str], Path],
    tiny_workflow: dict[str, Any],
    tmp_path: Path,
) -> None:
    """A batch's result.json said success, the LoRA nowhere: the job's warnings now hold it."""
    _another_models_lora(placed, "test-notes-wan-batch")
    workflow = tmp_path / "lora.json"
    workflow.write_text(json.dumps(_with_lora(tiny_workflow, "test-notes-wan-batch.safetensors", "merge")))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        json.dumps({"id": "j", "workflow": str(workflow), "set": {"11.noise_seed": 515151}}) + "\n"
    )
    db, out = f"sqlite:///{tmp_path / 'q.sqlite'}", tmp_path / "out"
    argv = ["batch", "submit", str(jobs), "--server", comfy_server.url, "--db", db, "--out", str(out)]
    assert main([*argv, "--wait", "--name", "lora"]) == 0
    record = json.loads((out / "j" / "result.json").read_text())
    assert record["status"] == "success"
    (warning,) = record["warnings"]
    assert warning.startswith("the server applied 3 LoRA weight(s) to nothing: no layer of the model has")


@pytest.mark.integration
def test_a_later_prompt_served_the_lora_from_the_cache_is_told_too(
    comfy_server: ComfyServer,
    placed: Callable[[str], Path],
    tiny_workflow: dict[str, Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ComfyUI says it only as it loads the LoRA: the next seed (the LoRA node cached) said nothing,
    and a batch of seeds warned on its first job at most."""
    _another_models_lora(placed, "test-notes-wan-cached")
    workflow = _with_lora(tiny_workflow, "test-notes-wan-cached.safetensors", "merge")
    path = tmp_path / "lora.json"
    path.write_text(json.dumps(workflow))
    events = []
    for seed in (616161, 626262):
        out = tmp_path / str(seed)
        caplog.clear()
        argv = ["run", str(path), "--server", comfy_server.url, "--out", str(out)]
        assert main([*argv, "--set", f"11.noise_seed={seed}"]) == 0
        assert "the server applied 3 LoRA weight(s) to nothing" in caplog.text, seed
        (record,) = out.glob("*/run.json")
        document = json.loads(record.read_text())
        events.append([e for e in document["telemetry"]["events"] if e["kind"] == "lora_not_applied"])
        cached = {n["node_id"] for n in document["nodes"] if n["cached"]}
    assert "21" in cached  # the second run's LoRA node came from the cache
    assert [(e["key"], e["calls"]) for e in events[1]] == [(e["key"], e["calls"]) for e in events[0]]
    workflow["21"]["inputs"]["strength_model"] = 0.5  # another LoRA loader: not told of the first's
    path.write_text(json.dumps(workflow))
    caplog.clear()
    assert main(["run", str(path), "--server", comfy_server.url, "--out", str(tmp_path / "half")]) == 0
    assert "the server applied 3 LoRA weight(s) to nothing" in caplog.text  # loaded again: said again
