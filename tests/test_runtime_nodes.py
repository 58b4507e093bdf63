"""Free VRAM and Patch Attention on the real pinned server with the tiny LTXV (CPU)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

from runner.errors import PromptFailedError
from runner.fixtures import FixtureSet
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import FIXTURE_NODES_DIR, NODE_PACK_DIR, REPO_ROOT
from runner.tracking.prompt import run_prompt
from runner.tracking.result import output_files
from runner.transport.client import ComfyClient

pytestmark = pytest.mark.integration

FREEVRAM_WORKFLOW = REPO_ROOT / "workflows" / "ltxv_tiny_t2v_freevram.api.json"
SAMPLER, DECODE, PATCH, FREE = "11", "12", "15", "16"


@pytest.fixture
def client(comfy_server: ComfyServer) -> Iterator[ComfyClient]:
    client = ComfyClient(comfy_server.url)
    yield client
    client.close()


def _fresh(workflow: dict[str, Any]) -> dict[str, Any]:
    """New prompt text, so text encoding and sampling run again (not from cache): every model is loaded."""
    workflow["3"]["inputs"]["text"] += f" ({uuid.uuid4().hex})"
    return workflow


def _free_vram_report(outputs: dict[str, Any], node_id: str) -> dict[str, Any]:
    report: dict[str, Any] = outputs[node_id]["leanvideo_memory"][0]
    return report


def test_freevram_workflow_frees_models_and_reloads_what_decode_needs(
    client: ComfyClient, comfy_server: ComfyServer
) -> None:
    workflow = json.loads(FREEVRAM_WORKFLOW.read_text())
    # A second Free VRAM right after the first: it must find nothing left to do (idempotent).
    workflow["17"] = {
        "class_type": "LeanVideoFreeVRAM",
        "inputs": {"value": [FREE, 0], "mode": "unload all", "free_ram": False},
    }
    workflow[DECODE]["inputs"]["samples"] = ["17", 0]
    result = run_prompt(client, _fresh(workflow), timeout=300)

    first, second = _free_vram_report(result.outputs, FREE), _free_vram_report(result.outputs, "17")
    print("Free VRAM report:", json.dumps({k: first[k] for k in ("unloaded", "steps", "seconds")}))
    print(f"RSS {first['before']['rss_bytes'] / 2**20:.1f} → {first['after']['rss_bytes'] / 2**20:.1f} MiB")
    kinds = {m["kind"] for m in first["before"]["loaded_models"]}
    assert {"diffusion_model", "text_encoder"} <= kinds, first["before"]
    assert first["before"]["loaded_bytes"] > 0
    assert first["after"]["loaded_models"] == [] and first["after"]["loaded_bytes"] == 0
    assert [step.split()[0] for step in first["steps"]] == ["unload", "gc.collect", "empty"]  # in that order
    assert first["before"]["vram_allocated_bytes"] is None  # CPU: null with a reason
    assert "CUDA" in first["after"]["vram_reason"]
    assert first["after"]["rss_bytes"] > 0
    assert second["unloaded"] == [] and second["after"]["loaded_models"] == []
    assert "Free VRAM (unload all)" in result.outputs[FREE]["text"][0]

    # VAE Decode still needed the VAE: it was loaded again, and the video was written.
    assert [item["filename"].endswith(".mp4") for _, item in output_files(result.outputs)] == [True]
    telemetry = httpx.get(f"{comfy_server.url}/leanvideo/telemetry").json()
    assert [m["kind"] for m in telemetry["comfy"]["loaded_models"]] == ["other"]  # only the VAE is back
    record = httpx.get(f"{comfy_server.url}/leanvideo/telemetry/prompts/{result.prompt_id}").json()
    events = [e for e in record["events"] if e["kind"] == "free_vram"]
    assert [e["after"]["loaded_bytes"] for e in events] == [0, 0]
    assert events[0]["before"]["loaded_bytes"] == first["before"]["loaded_bytes"]


def test_nodes_after_free_vram_stay_cached_when_only_a_later_input_changes(client: ComfyClient) -> None:
    """Connected, Free VRAM is cached like any node: changing the frame rate must not sample and decode
    again. With nothing connected (a sink, nothing after it) it runs on every prompt."""
    workflow = _fresh(json.loads(FREEVRAM_WORKFLOW.read_text()))
    workflow["31"] = {"class_type": "LeanVideoFreeVRAM", "inputs": {"mode": "unload all", "free_ram": False}}
    first = run_prompt(client, workflow, timeout=300)
    workflow["13"]["inputs"]["fps"] = 12.0
    second = run_prompt(client, workflow, timeout=300)
    third = run_prompt(client, workflow, timeout=300)  # nothing changed
    ran = {t.node_id: t.cached for t in first.nodes}
    cached = {t.node_id: t.cached for t in second.nodes}
    assert not ran[SAMPLER] and not ran[FREE]
    assert cached[SAMPLER] and cached[FREE] and cached[DECODE], cached
    assert not cached["13"]  # the changed node ran
    assert not cached["31"] and "31" in third.outputs  # the sink ran again, each time


def test_free_vram_alone_runs_first_and_fed_the_last_result_frees_at_the_end(client: ComfyClient) -> None:
    """As docs/nodes-runtime.md says: with nothing on value ComfyUI runs it before anything (it frees
    what the previous prompt left); fed the decoded frames, it runs after the decode and frees what this
    prompt loaded."""
    workflow = _fresh(json.loads(FREEVRAM_WORKFLOW.read_text()))
    workflow["31"] = {"class_type": "LeanVideoFreeVRAM", "inputs": {"mode": "unload all", "free_ram": False}}
    workflow["32"] = {
        "class_type": "LeanVideoFreeVRAM",
        "inputs": {"value": [DECODE, 0], "mode": "unload all", "free_ram": False},
    }
    result = run_prompt(client, workflow, timeout=300)
    ran = [t.node_id for t in result.nodes if not t.cached]
    assert ran[0] == "31" and ran.index("32") > ran.index(DECODE), ran
    end = _free_vram_report(result.outputs, "32")
    assert end["before"]["loaded_bytes"] > 0 and end["after"]["loaded_bytes"] == 0


def test_free_vram_with_nothing_on_value_but_its_output_used_is_named_before_anything_runs(
    client: ComfyClient,
) -> None:
    """Disconnected by mistake, it ran first and passed nothing on: VAE Decode then failed with
    "'NoneType' object is not subscriptable", naming itself."""
    workflow = _fresh(json.loads(FREEVRAM_WORKFLOW.read_text()))
    del workflow[FREE]["inputs"]["value"]
    with pytest.raises(PromptFailedError) as caught:
        run_prompt(client, workflow, timeout=300)
    error = caught.value.result.error
    assert error["node_id"] == FREE and error["class_type"] == "LeanVideoFreeVRAM"
    said = f"Free VRAM: nothing is connected to its 'value' input, yet its output goes to node {DECODE} ("
    assert said in error["message"]
    title = workflow[DECODE].get("_meta", {}).get("title") or "VAEDecode"  # as the editor shows it
    assert f"node {DECODE} ({title}, input 'samples')" in error["message"], error["message"]
    assert [t.node_id for t in caught.value.result.nodes if not t.cached] == [FREE]  # nothing else ran


def test_free_vram_with_nothing_on_value_but_its_output_used_is_refused_before_it_is_submitted(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`workflow validate` said it was valid and `run` submitted it, to fail at the node (exit 6): both
    refuse it now (exit 5), naming the node that would get nothing, and nothing reaches the queue."""
    from runner.cli.main import main

    workflow = json.loads(FREEVRAM_WORKFLOW.read_text())
    del workflow[FREE]["inputs"]["value"]
    path = tmp_path / "free_vram_unfed.json"
    path.write_text(json.dumps(workflow))
    with ComfyClient(comfy_server.url) as history_of:
        before = len(history_of.get_json("/history"))
        assert main(["workflow", "validate", str(path), "--server", comfy_server.url, "--json"]) == 5
        report = capsys.readouterr().out
        assert main(["run", str(path), "--server", comfy_server.url, "--out", str(tmp_path / "out")]) == 5
        assert len(history_of.get_json("/history")) == before  # nothing was submitted
    err = capsys.readouterr().err
    title = workflow[DECODE].get("_meta", {}).get("title") or "VAEDecode"
    said = (
        f"nothing is connected to it, yet the node's output goes to node {DECODE} ({title}, input "
        "'samples'), which would get nothing: connect what it should pass on to 'value', or remove that link"
    )
    assert f"node {FREE} (LeanVideoFreeVRAM) input 'value': {said}" in err, err
    (problem,) = json.loads(report)["problems"]
    assert (problem["node_id"], problem["input"], problem["message"]) == (FREE, "value", said), problem
    assert not (tmp_path / "out").exists()


def test_free_vram_text_encoders_only_keeps_the_other_models(client: ComfyClient) -> None:
    workflow = json.loads(FREEVRAM_WORKFLOW.read_text())
    workflow[FREE]["inputs"]["mode"] = "unload text encoders only"
    result = run_prompt(client, _fresh(workflow), timeout=300)
    report = _free_vram_report(result.outputs, FREE)
    assert report["unloaded"] == ["SD1ClipModel"], report
    assert "LTXV" in report["kept"]
    after = {m["kind"] for m in report["after"]["loaded_models"]}
    assert "diffusion_model" in after and "text_encoder" not in after
    # on a CPU, without free_ram, the node says why the RSS it shows does not fall
    text = " ".join(result.outputs[FREE]["text"][0].split())
    assert "no GPU: the models ran from RAM" in text and "free_ram drops that cache" in text, text


@pytest.fixture
def fresh_server(server_config: ServerConfig, tiny_models: FixtureSet) -> Iterator[ComfyServer]:
    """A server of its own: how far RSS falls must not depend on what earlier tests left cached."""
    config = replace(server_config, custom_node_dirs=(NODE_PACK_DIR, FIXTURE_NODES_DIR))
    with ComfyServer(config) as server:
        yield server


def test_free_ram_drops_comfyui_cache_so_rss_falls_after_the_prompt(fresh_server: ComfyServer) -> None:
    comfy_server = fresh_server
    workflow = json.loads(FREEVRAM_WORKFLOW.read_text())
    workflow[FREE]["inputs"]["free_ram"] = True
    with ComfyClient(comfy_server.url) as client:
        result = run_prompt(client, _fresh(workflow), timeout=300)
    report = _free_vram_report(result.outputs, FREE)
    assert "node cache dropped after this prompt" in report["steps"]
    record = httpx.get(f"{comfy_server.url}/leanvideo/telemetry/prompts/{result.prompt_id}").json()
    # The worker applies the cache drop between prompts; the text encoder's ~250 MB then leave RSS.
    deadline, rss = time.monotonic() + 15.0, record["rss_end_bytes"]
    while time.monotonic() < deadline:
        snapshot = httpx.get(f"{comfy_server.url}/leanvideo/telemetry").json()
        rss = snapshot["process"]["rss_bytes"]
        if snapshot["comfy"]["loaded_models"] == [] and rss < record["rss_end_bytes"] - 100 * 2**20:
            break
        time.sleep(0.2)
    print(f"free_ram: RSS at prompt end {record['rss_end_bytes'] / 2**20:.1f} MiB → {rss / 2**20:.1f} MiB")
    assert rss < record["rss_end_bytes"] - 100 * 2**20


def _latent_workflow(tiny_workflow: dict[str, Any], *, mode: str | None, prefix: str) -> dict[str, Any]:
    """The tiny workflow saving the sampled latent; with ``mode``, Patch Attention on the model."""
    workflow = {k: v for k, v in tiny_workflow.items() if k not in (DECODE, "13", "14")}
    workflow["20"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": [SAMPLER, 0], "filename_prefix": prefix},
    }
    if mode is not None:
        workflow[PATCH] = {
            "class_type": "LeanVideoPatchAttention",
            "inputs": {"model": ["1", 0], "mode": mode},
        }
        workflow[SAMPLER]["inputs"]["model"] = [PATCH, 0]
    return workflow


def _saved_latent(result_outputs: dict[str, Any], output_dir: Path) -> torch.Tensor:
    item = result_outputs["20"]["latents"][0]
    return load_file(str(output_dir / item["subfolder"] / item["filename"]))["latent_tensor"]


def test_patched_attention_output_equals_unpatched_on_cpu(
    client: ComfyClient, comfy_server: ComfyServer, tiny_workflow: dict[str, Any]
) -> None:
    output_dir = comfy_server.config.output_dir
    plain = run_prompt(client, _latent_workflow(tiny_workflow, mode=None, prefix="attn/plain"), timeout=300)
    patched = run_prompt(
        client, _latent_workflow(tiny_workflow, mode="auto", prefix="attn/auto"), timeout=300
    )
    sage = run_prompt(client, _latent_workflow(tiny_workflow, mode="sage", prefix="attn/sage"), timeout=300)

    assert patched.outputs[PATCH]["text"] == ["attention: auto → sdpa (no CUDA device: PyTorch SDPA)"]
    assert "attention left unchanged" in sage.outputs[PATCH]["text"][0]
    record = httpx.get(f"{comfy_server.url}/leanvideo/telemetry/prompts/{patched.prompt_id}").json()
    counted = {e["key"]: e["calls"] for e in record["events"] if e["kind"] == "attention"}
    assert counted["sdpa"] > 0 and set(counted) == {"sdpa"}  # SDPA takes every call
    record = httpx.get(f"{comfy_server.url}/leanvideo/telemetry/prompts/{sage.prompt_id}").json()
    [event] = [e for e in record["events"] if e["kind"] == "attention"]
    assert event["key"].startswith("not patched: ") and "attention left unchanged" in event["key"]
    assert event["outcome"] == "not patched"
    reference = _saved_latent(plain.outputs, output_dir)
    for result in (patched, sage):
        latent = _saved_latent(result.outputs, output_dir)
        error = (latent - reference).abs().max().item()
        print(f"{result.outputs[PATCH]['text'][0]}: max |Δ latent| = {error:.3g}")
        torch.testing.assert_close(latent, reference, rtol=1e-4, atol=1e-5)


def test_free_vram_as_a_sink_keeps_the_connected_model(
    client: ComfyClient, tiny_workflow: dict[str, Any]
) -> None:
    workflow = {
        "1": tiny_workflow["1"],
        "30": {
            "class_type": "LeanVideoFreeVRAM",
            "inputs": {"value": ["1", 0], "mode": "unload all but the connected model", "free_ram": False},
        },
    }
    report = _free_vram_report(run_prompt(client, workflow, timeout=120).outputs, "30")
    loaded = {m["name"]: m["kind"] for m in report["before"]["loaded_models"]}
    assert report["kept"] == [name for name, kind in loaded.items() if kind == "diffusion_model"]
    assert sorted(report["unloaded"]) == sorted(
        name for name, kind in loaded.items() if kind != "diffusion_model"
    )
    assert [m["kind"] for m in report["after"]["loaded_models"]] == ["diffusion_model"] * len(report["kept"])


def test_nodes_are_declared_in_comfyui_voice(comfy_server: ComfyServer) -> None:
    info = httpx.get(f"{comfy_server.url}/object_info").json()
    free, patch = info["LeanVideoFreeVRAM"], info["LeanVideoPatchAttention"]
    assert (free["display_name"], free["category"], free["output_node"]) == ("Free VRAM", "utils", True)
    assert (patch["display_name"], patch["category"]) == ("Patch Attention", "advanced/model_patches")
    assert free["output"] == ["*"] and patch["output"] == ["MODEL"]
    for node in (free, patch):
        for kind in ("required", "optional"):
            for name, spec in node["input"].get(kind, {}).items():
                assert spec[1].get("tooltip"), f"{node['name']}.{name} has no tooltip"
    assert patch["input"]["required"]["mode"][1]["options"][:3] == ["auto", "sdpa", "sage"]


def test_free_vram_with_nothing_connected_says_so(comfy: Any) -> None:
    from leanvideo.memory_ops import FreeMode, release_models

    report = release_models(FreeMode.ALL_BUT_CONNECTED, keep=None)
    assert report.notes == ("nothing is connected, so no model is kept: released all",)
    report = release_models(FreeMode.ALL_BUT_CONNECTED, keep="a string")
    assert report.notes == ("the connected value (str) holds no model: released all",)
    report = release_models(FreeMode.ALL_BUT_CONNECTED, keep={"samples": torch.zeros(1, 4, 2, 2)})
    assert report.notes == ("the connected value (LATENT) holds no model: released all",)
