"""The INT8 loader nodes as the real server declares them, and the INT8 text encoder node in the tiny
LTXV workflow (its frames compared with the fp16 CLIP-L run)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from runner.errors import PromptFailedError
from runner.jobs.int8_files import QUANTIZE_ON_LOAD_WIDGET
from runner.local.server import ComfyServer
from runner.local.workspace import REPO_ROOT
from runner.tracking.outputs import download_file
from runner.tracking.prompt import run_prompt
from runner.transport.client import ComfyClient

pytestmark = pytest.mark.integration

NODES = {
    "LeanVideoDiffusionModelLoaderINT8": ("Load Diffusion Model (INT8)", "MODEL", "unet_name"),
    "LeanVideoTextEncoderLoaderINT8": ("Load Text Encoder (INT8)", "CLIP", "clip_name"),
}


@pytest.mark.parametrize("node_id", sorted(NODES))
def test_node_schema_is_stable_and_documented(comfy_server: ComfyServer, node_id: str) -> None:
    info = httpx.get(f"{comfy_server.url}/object_info/{node_id}", timeout=30).json()[node_id]
    display_name, output, file_input = NODES[node_id]
    assert info["display_name"] == display_name
    assert info["category"] == "advanced/loaders"
    assert info["output"] == [output]
    required = info["input"]["required"]
    assert file_input in required
    for name, spec in required.items():
        assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert all(info["output_tooltips"]), f"{node_id}: an output has no tooltip"
    routes = ["auto", "w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn", "w8a8"]
    assert required["path"][1]["options"] == routes
    # ComfyUI's float32 text encoders are said where they apply only (the DiT loader said it too)
    said = "runs text encoders in float32" in required["compute_dtype"][1]["tooltip"]
    assert said == (output == "CLIP")
    assert "fp8" in required["quantize_on_load"][1]["tooltip"]


@pytest.mark.parametrize("node_id", sorted(QUANTIZE_ON_LOAD_WIDGET))
def test_quantize_on_load_sits_where_models_check_reads_it_in_an_editor_file(
    comfy_server: ComfyServer, node_id: str
) -> None:
    """`models check` reads an editor file's quantize_on_load by its widget's place: the declared order."""
    info = httpx.get(f"{comfy_server.url}/object_info/{node_id}", timeout=30).json()[node_id]
    order = info["input_order"]["required"]
    kinds = [info["input"]["required"][name][0] for name in order]
    assert set(kinds) <= {"COMBO", "BOOLEAN"}, kinds  # widgets all: each has a value in widgets_values
    assert order.index("quantize_on_load") == QUANTIZE_ON_LOAD_WIDGET[node_id]


def _frames(client: ComfyClient, workflow: dict[str, Any], directory: Path) -> np.ndarray:
    result = run_prompt(client, workflow, timeout=300)
    paths = [download_file(client, item, directory) for item in result.outputs["14"]["images"]]
    return np.stack([np.asarray(Image.open(path).convert("RGB"), dtype=np.float64) for path in paths])


def test_int8_text_encoder_node_in_the_tiny_workflow(
    comfy_server: ComfyServer, tiny_workflow: dict[str, Any], tmp_path: Path
) -> None:
    base = {key: value for key, value in tiny_workflow.items() if key not in ("13", "14")}
    base["14"] = {
        "class_type": "SaveImage",
        "inputs": {"images": ["12", 0], "filename_prefix": "test-int8-te/fp16"},
    }
    int8 = {key: dict(value, inputs=dict(value["inputs"])) for key, value in base.items()}
    int8["2"] = {
        "class_type": "LeanVideoTextEncoderLoaderINT8",
        "inputs": {
            "clip_name": "clip_l.safetensors",
            "type": "stable_diffusion",
            "compute_dtype": "default",
            "path": "auto",
            "quantize_on_load": True,
            "convrot": False,
        },
    }
    int8["14"]["inputs"]["filename_prefix"] = "test-int8-te/int8"
    with ComfyClient(comfy_server.url) as client:
        reference = _frames(client, base, tmp_path / "fp16")
        frames = _frames(client, int8, tmp_path / "int8")
    mse = float(np.mean((reference - frames) ** 2))
    psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
    print(f"PSNR, tiny LTXV frames with the INT8 CLIP-L vs fp16 CLIP-L: {psnr:.2f} dB")
    assert psnr >= 30.0
    # The server log says how the encoder was read, as for a diffusion model (troubleshooting.md)
    log = comfy_server.log_path.read_text(encoding="utf-8", errors="replace")
    assert re.search(r"Loaded \S*clip_l\.safetensors \(float, quantized on load\) with matmul route", log)


def test_loader_report_and_telemetry_show_the_kernel_choices(
    comfy_server: ComfyServer, tiny_workflow: dict[str, Any]
) -> None:
    """A first run measures the kernels of the INT8 CLIP-L's shapes (convrot: shape classes no other
    test measured) and notes each choice in the prompt's telemetry; a second load of the same file
    (another compute_dtype, so the loader runs again) reports the choices from the table on disk."""
    workflow = {key: value for key, value in tiny_workflow.items() if key not in ("13", "14")}
    workflow["14"] = {"class_type": "PreviewImage", "inputs": {"images": ["12", 0]}}
    loader = {
        "clip_name": "clip_l.safetensors",
        "type": "stable_diffusion",
        "compute_dtype": "default",
        "path": "auto",
        "quantize_on_load": True,
        "convrot": True,
    }
    workflow["2"] = {"class_type": "LeanVideoTextEncoderLoaderINT8", "inputs": loader}
    second = dict(workflow, **{"2": {"class_type": workflow["2"]["class_type"], "inputs": dict(loader)}})
    second["2"]["inputs"]["compute_dtype"] = "fp32"  # what "default" is on a CPU: same shape classes
    first_id, later_reports = _run_hearing_reports(comfy_server.url, workflow)
    with ComfyClient(comfy_server.url) as client:
        second_run = run_prompt(client, second, timeout=300)
    records = httpx.get(f"{comfy_server.url}/leanvideo/telemetry/prompts", timeout=30).json()["prompts"]
    events = {r["prompt_id"]: r["events"] for r in records}
    measured = [e for e in events[first_id] if e["kind"] == "int8_kernel"]
    print("\n".join(f"{e['shape']} -> {e['kernel']} {e['seconds']}" for e in measured))
    assert {e["shape"].split("|")[2] for e in measured} >= {"768x768", "3072x768", "768x3072"}
    assert all(e["source"] == "measured" and "w8a16" in e["seconds"] for e in measured)
    # every candidate ran on the server's weights (ComfyUI's inference tensors) or was ruled out for why
    # it cannot run here, never for an error
    errors = [f"{k}: {why}" for e in measured for k, why in e["rejected"].items() if why.startswith("error")]
    assert not errors, errors
    [report] = second_run.outputs["2"]["text"]
    print(report)
    assert report.startswith("INT8 kernels: auto (measured at first use per layer shape): ")
    assert "shape class(es)\n" in report  # which kernels on how many shapes, on the first line
    assert report.splitlines()[-1].startswith("  table: ")
    assert report.splitlines()[-1].endswith("leanvideo/int8_kernels.json")
    # the first run's loader reported no convrot shape class yet; each choice the sampler made sent the
    # report again, the last one with every shape chosen (what the editor then shows on the loader)
    history = httpx.get(f"{comfy_server.url}/history/{first_id}", timeout=30).json()[first_id]
    [token] = history["outputs"]["2"]["leanvideo_report"]  # the loader run's, in its UI output
    assert later_reports and {sent for sent, _ in later_reports} == {token}
    [loaded] = history["outputs"]["2"]["text"]  # as the loader said it, before the sampler ran
    assert "convrot256 →" not in loaded and "not run yet" not in later_reports[-1][1]
    assert later_reports[-1][1].splitlines()[1:-1] == report.splitlines()[1:-1]
    for shape in ("768x768", "3072x768", "768x3072"):
        assert re.search(
            rf"{shape} rows<=\d+ float32 row\+convrot256 → "
            r"(w8a16|int_mm|int_mm_fused|kitchen|onednn) \(measured\)",
            report,
        )
    assert "not run yet" not in report
    [noted] = [e for e in events[second_run.prompt_id] if e["kind"] == "int8_kernels"]
    assert noted["report"] == report and noted["node_id"] == "2"  # which loader, of the prompt's several
    # only this model's choices: the server's table holds every model's, other layouts of these shapes too
    listed = [line for line in report.splitlines() if " → " in line]
    assert listed and all("row+convrot256 →" in line for line in listed), listed
    assert noted["choices"] and all(key.endswith("|row+convrot256") for key in noted["choices"])


def _run_hearing_reports(url: str, workflow: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """Run ``workflow`` through the plain API, as the editor does; its prompt id and the
    ``leanvideo.report`` messages (token, text) that came while it ran."""
    import uuid

    import websocket

    client_id = uuid.uuid4().hex
    ws = websocket.create_connection(f"{url.replace('http', 'ws', 1)}/ws?clientId={client_id}", timeout=300)
    try:
        body = {"prompt": workflow, "client_id": client_id}
        prompt_id = httpx.post(f"{url}/prompt", json=body, timeout=30).json()["prompt_id"]
        reports: list[tuple[str, str]] = []
        while True:
            raw = ws.recv()
            if not isinstance(raw, str):
                continue  # a preview image
            message = json.loads(raw)
            data = message.get("data") or {}
            if message["type"] == "leanvideo.report":
                reports.append((data["token"], "\n".join(data["text"])))
            if message["type"] == "execution_error" and data.get("prompt_id") == prompt_id:
                pytest.fail(f"the prompt failed: {data.get('exception_message')}")
            if (
                message["type"] == "executing"
                and data.get("node") is None
                and data.get("prompt_id") == prompt_id
            ):
                return prompt_id, reports
    finally:
        ws.close()


@pytest.mark.parametrize(
    ("node_id", "file_input"),
    [("1", "ckpt_name"), ("2", "clip_name")],
    ids=["checkpoint", "text encoder"],
)
def test_a_missing_model_file_is_refused_before_the_prompt_is_queued(
    comfy_server: ComfyServer, node_id: str, file_input: str
) -> None:
    """ComfyUI checks dropdown values of V1 nodes only: the INT8 loaders (V3) check their file names
    themselves, so a wrong one is refused at /prompt as the stock loaders' are, not when the node runs."""
    workflow = json.loads((REPO_ROOT / "workflows/ltxv_tiny_t2v_int8.api.json").read_text(encoding="utf-8"))
    workflow[node_id]["inputs"][file_input] = "nothere.safetensors"
    answer = httpx.post(f"{comfy_server.url}/prompt", json={"prompt": workflow}, timeout=30)
    assert answer.status_code == 400, answer.text
    [error] = answer.json()["node_errors"][node_id]["errors"]
    assert error["type"] == "custom_validation_failed"
    assert error["details"].startswith(f"{file_input} - 'nothere.safetensors' is not in models/")
    # no close name: the files there are listed, not every one of them as "close" for sharing the suffix
    assert "close names" not in error["details"] and "(there: " in error["details"], error
    # a name close to one there: said as such
    near = {"ckpt_name": "ltxv-tiny-int8.safetensor", "clip_name": "clip-l-int8.safetensors"}[file_input]
    workflow[node_id]["inputs"][file_input] = near
    answer = httpx.post(f"{comfy_server.url}/prompt", json={"prompt": workflow}, timeout=30)
    [error] = answer.json()["node_errors"][node_id]["errors"]
    assert "close names: " in error["details"] and "int8" in error["details"].split("close names: ")[1], error


def test_a_dropdown_value_that_is_no_choice_is_named_with_the_choices(comfy_server: ComfyServer) -> None:
    """ComfyUI does not check V3 dropdowns: Free VRAM's mode is refused at /prompt (once, with its
    choices), a loader's path before it loads anything, each naming the input and what it may be."""
    workflow = json.loads((REPO_ROOT / "workflows/ltxv_tiny_t2v_int8.api.json").read_text(encoding="utf-8"))
    free = next(i for i, n in workflow.items() if n["class_type"] == "LeanVideoFreeVRAM")
    workflow[free]["inputs"]["mode"] = "unload everything"
    answer = httpx.post(f"{comfy_server.url}/prompt", json={"prompt": workflow}, timeout=30)
    assert answer.status_code == 400, answer.text
    [error] = answer.json()["node_errors"][free]["errors"]
    assert error["details"].startswith("mode - 'unload everything' is not one of ['unload all', ")

    workflow = json.loads((REPO_ROOT / "workflows/ltxv_tiny_t2v_int8.api.json").read_text(encoding="utf-8"))
    # Patch Attention: a SageAttention variant not installed here is no mistake (the workflow may come
    # from a machine that has it): it runs, with the attention left unchanged; an unknown mode is one
    workflow[free]["inputs"]["mode"] = "unload all"
    patch = next(i for i, n in workflow.items() if n["class_type"] == "LeanVideoPatchAttention")
    workflow[patch]["inputs"]["mode"] = "flash"
    answer = httpx.post(f"{comfy_server.url}/prompt", json={"prompt": workflow}, timeout=30)
    [error] = answer.json()["node_errors"][patch]["errors"]
    assert error["details"].startswith("mode - 'flash' is not one of ['auto', 'sdpa', 'sage', 'sageattn_qk")
    workflow[patch]["inputs"]["mode"] = "sageattn_qk_int8_pv_fp16_cuda"
    # the runner's own check takes it too: the menu lists every variant (it refused one not installed)
    from runner.graph.validate import validate_workflow

    object_info = httpx.get(f"{comfy_server.url}/object_info", timeout=60).json()
    assert not [problem for problem in validate_workflow(workflow, object_info) if problem.node_id == patch]
    with ComfyClient(comfy_server.url) as client:
        result = run_prompt(client, workflow, timeout=300)
    assert "attention left unchanged" in result.outputs[patch]["text"][0]

    workflow["1"]["inputs"]["path"] = "sage"
    with ComfyClient(comfy_server.url) as client, pytest.raises(PromptFailedError) as failed:
        run_prompt(client, workflow, timeout=120)
    error = failed.value.result.error or {}
    message = str(error.get("message") or error)
    assert "Load Checkpoint (INT8): path: 'sage' is not one of ['auto', " in message, error


def test_every_int8_loader_the_prompt_runs_is_checked_before_one_loads(comfy: SimpleNamespace) -> None:
    """What each INT8 loader checks before it loads (in this process, where the order ComfyUI picks
    among ready nodes plays no part): a later loader's bad dropdown value stops the prompt there, with
    nothing loaded (a 13B checkpoint: minutes saved); a loader that feeds no output node is not run by
    ComfyUI, so it is not checked either."""
    import nodes  # ComfyUI's node registry, as the server has it (built-in nodes)
    from leanvideo.node_checks import require_prompt_choices
    from leanvideo.nodes_loaders import LOADERS

    assert nodes.NODE_CLASS_MAPPINGS["SaveImage"].OUTPUT_NODE
    loader = {"ckpt_name": "ltxv-tiny-int8.safetensors", "compute_dtype": "default", "path": "auto"}
    encoder = {"clip_name": "clip-l-int8.safetensors", "type": "ltxv", "path": "auto"}
    prompt: dict[str, Any] = {
        "1": {"class_type": "LeanVideoCheckpointLoaderINT8", "inputs": loader},
        "2": {"class_type": "LeanVideoTextEncoderLoaderINT8", "inputs": encoder},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 1]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "x"}},
    }
    require_prompt_choices(prompt, LOADERS)
    prompt["2"]["inputs"] = encoder | {"type": "t5"}
    with pytest.raises(ValueError) as refused:
        require_prompt_choices(prompt, LOADERS)
    message = str(refused.value)
    assert "node 2 (Load Text Encoder (INT8)): type: 't5' is not one of ['stable_diffusion', " in message
    assert message.endswith("; nothing was loaded")
    prompt["2"]["inputs"] = encoder
    prompt["5"] = {"class_type": "LeanVideoCheckpointLoaderINT8", "inputs": loader | {"path": "fast"}}
    require_prompt_choices(prompt, LOADERS)  # node 5 feeds nothing: ComfyUI does not run it


def test_a_file_name_that_is_no_text_is_said_in_words(comfy_server: ComfyServer) -> None:
    """null or a number as a loader's file: refused at /prompt naming its own input (a number), or by
    the first INT8 loader that runs, before it loads (null looks like a link at /prompt), where both
    used to fail as a TypeError. Said the same whichever loader ComfyUI runs first."""
    workflow = json.loads((REPO_ROOT / "workflows/ltxv_tiny_t2v_int8.api.json").read_text(encoding="utf-8"))
    workflow["2"]["inputs"]["clip_name"] = 5
    answer = httpx.post(f"{comfy_server.url}/prompt", json={"prompt": workflow}, timeout=30)
    assert answer.status_code == 400, answer.text
    [error] = answer.json()["node_errors"]["2"]["errors"]  # its own input named, not the next node's
    assert (
        error["details"] == "clip_name - 5 is not a file name: give one of the files in models/text_encoders"
    )
    workflow["2"]["inputs"]["clip_name"] = None  # passes /prompt (a link looks the same there)
    with ComfyClient(comfy_server.url) as client, pytest.raises(PromptFailedError) as failed:
        run_prompt(client, workflow, timeout=120)
    message = str((failed.value.result.error or {}).get("message"))
    assert "node 2 (Load Text Encoder (INT8)): clip_name: no file is chosen (null)" in message, message


def test_a_node_error_names_the_file_and_the_packages_error_type(comfy_server: ComfyServer) -> None:
    """A float DiT given to Load Diffusion Model (INT8) with quantize_on_load off: the server's error (the
    editor's dialog, /history) names the file, says what to do, and gives the error's type by the
    package's name, not by the folder path ComfyUI imported the pack under."""
    info = httpx.get(f"{comfy_server.url}/object_info", timeout=30).json()

    def node(class_type: str, **given: Any) -> dict[str, Any]:
        inputs = info[class_type]["input"]
        defaults = {
            name: spec[1]["default"]
            for section in ("required", "optional")
            for name, spec in (inputs.get(section) or {}).items()
            if len(spec) > 1 and "default" in spec[1]
        }
        return {"class_type": class_type, "inputs": defaults | given}

    workflow = {
        "1": node(
            "LeanVideoDiffusionModelLoaderINT8", unet_name="ltxv-tiny-dit.safetensors", quantize_on_load=False
        ),
        "2": node("LeanVideoFreeVRAM", value=["1", 0]),
    }
    with ComfyClient(comfy_server.url) as client, pytest.raises(PromptFailedError) as failed:
        run_prompt(client, workflow, timeout=120)
    prompt_id = failed.value.result.prompt_id
    history = httpx.get(f"{comfy_server.url}/history/{prompt_id}", timeout=30).json()
    [error] = [data for kind, data in history[prompt_id]["status"]["messages"] if kind == "execution_error"]
    assert error["exception_type"] == "leanvideo.int8.spec.Int8FormatError", error
    assert "ltxv-tiny-dit.safetensors: holds no INT8 weights" in error["exception_message"]
    assert "turn on quantize_on_load" in error["exception_message"]


def test_the_text_encoder_loader_says_that_comfyui_computes_text_encoders_in_float32(
    comfy_server: ComfyServer, tiny_workflow: dict[str, Any]
) -> None:
    """ComfyUI's text encoders run in float32 whatever their weights' dtype (``SDClipModel`` passes
    ``dtype=torch.float32``): `compute_dtype=fp16` on the text encoder loader changed only how the
    weights that are not INT8 are held, and its report did not say so (the diffusion loaders' do)."""
    workflow = {key: value for key, value in tiny_workflow.items() if key not in ("13", "14")}
    workflow["14"] = {"class_type": "PreviewImage", "inputs": {"images": ["12", 0]}}
    workflow["2"] = {
        "class_type": "LeanVideoTextEncoderLoaderINT8",
        "inputs": {
            "clip_name": "clip_l.safetensors",
            "type": "stable_diffusion",
            "compute_dtype": "fp16",
            "path": "w8a16",
            "quantize_on_load": True,
            "convrot": False,
        },
    }
    with ComfyClient(comfy_server.url) as client:
        result = run_prompt(client, workflow, timeout=300)
    [report] = result.outputs["2"]["text"]
    assert report.splitlines()[-1] == (
        "compute dtype: float16 asked; ComfyUI's text encoders compute in float32 (the weights that are "
        "not INT8, embeddings and norms, are held in float16)"
    ), report
