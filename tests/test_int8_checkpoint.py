"""Release checkpoints (diffusion model + VAE in one file, config in the metadata) on the real pinned
server: "Load Checkpoint (INT8)" runs the tiny LTXV checkpoint end to end (frames compared losslessly
with stock CheckpointLoaderSimple), "Load Diffusion Model (INT8)" takes a full checkpoint placed under
diffusion_models, and a checkpoint without a VAE is refused with the file named."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from leanvideo.int8.files import read_header, read_tensors
from safetensors.torch import save_file

from runner.errors import PromptFailedError
from runner.fixtures import FixtureSet
from runner.jobs.frames import psnr_db, read_frames
from runner.local.server import ComfyServer
from runner.local.workspace import Workspace
from runner.tracking.outputs import download_file
from runner.tracking.prompt import run_prompt
from runner.transport.client import ComfyClient

pytestmark = pytest.mark.integration

PSNR_THRESHOLD_DB = 40.0  # as in test_int8_e2e: decoded frames, INT8 vs bf16
NODE_ID = "LeanVideoCheckpointLoaderINT8"
SHARED_INPUTS = {
    "compute_dtype": "default",
    "path": "auto",
    "quantize_on_load": True,
    "convrot": False,
    "lora_mode": "merge",
}


def _lossless(base: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``base`` saving its decoded frames as PNGs (node 14) instead of an MP4."""
    workflow = {key: dict(value, inputs=dict(value["inputs"])) for key, value in base.items() if key != "13"}
    workflow["14"] = {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": prefix}}
    return workflow


def _frames(client: ComfyClient, workflow: dict[str, Any], directory: Path) -> np.ndarray:
    result = run_prompt(client, workflow, timeout=300)
    paths = [download_file(client, item, directory) for item in result.outputs["14"]["images"]]
    return read_frames(paths)


@contextlib.contextmanager
def _removed_after(path: Path) -> Iterator[None]:
    """Remove ``path`` (a model file a test placed in the shared models folder) when the block ends."""
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def test_checkpoint_node_schema(comfy_server: ComfyServer) -> None:
    info = httpx.get(f"{comfy_server.url}/object_info/{NODE_ID}", timeout=30).json()[NODE_ID]
    assert info["display_name"] == "Load Checkpoint (INT8)"
    assert info["category"] == "advanced/loaders"
    assert info["output"] == ["MODEL", "VAE"]
    assert info["output_name"] == ["MODEL", "VAE"]
    required = info["input"]["required"]
    assert list(required) == ["ckpt_name", *SHARED_INPUTS]
    assert "ltxv-tiny.safetensors" in required["ckpt_name"][1]["options"]
    for name, spec in required.items():
        assert spec[1].get("tooltip"), f"{NODE_ID}.{name} has no tooltip"


def test_checkpoint_node_runs_the_tiny_ltxv_close_to_stock(
    comfy_server: ComfyServer, tiny_models: FixtureSet, tiny_workflow: dict[str, Any], tmp_path: Path
) -> None:
    stock = _lossless(tiny_workflow, "test-int8-ckpt/stock")
    ours = _lossless(tiny_workflow, "test-int8-ckpt/int8")
    ours["1"] = {"class_type": NODE_ID, "inputs": {"ckpt_name": tiny_models.checkpoint.name, **SHARED_INPUTS}}
    assert ours["12"]["inputs"]["vae"] == ["1", 2]
    ours["12"]["inputs"]["vae"] = ["1", 1]  # our node outputs MODEL, VAE (no CLIP)
    with ComfyClient(comfy_server.url) as client:
        reference = _frames(client, stock, tmp_path / "stock")
        frames = _frames(client, ours, tmp_path / "int8")
    psnr = psnr_db(reference, frames)
    print(f"PSNR, tiny LTXV frames, Load Checkpoint (INT8) vs CheckpointLoaderSimple: {psnr:.2f} dB")
    assert frames.shape == reference.shape and frames.shape[0] == 9
    assert psnr >= PSNR_THRESHOLD_DB


def test_dit_loader_takes_a_full_checkpoint(
    comfy_server: ComfyServer,
    workspace: Workspace,
    tiny_models: FixtureSet,
    tiny_workflow: dict[str, Any],
    tmp_path: Path,
) -> None:
    """The whole checkpoint (DiT + VAE + metadata) under diffusion_models: the DiT loader uses its
    diffusion-model part and gives the frames of the DiT-only file."""
    placed = workspace.models_dir / "diffusion_models" / "test-full-checkpoint.safetensors"
    shutil.copyfile(tiny_models.checkpoint, placed)
    frames = {}
    with ComfyClient(comfy_server.url) as client, _removed_after(placed):
        for name in (placed.name, tiny_models.diffusion_model.name):
            workflow = _lossless(tiny_workflow, f"test-int8-ckpt/dit-{name}")
            workflow["20"] = {
                "class_type": "LeanVideoDiffusionModelLoaderINT8",
                "inputs": {"unet_name": name, **SHARED_INPUTS},
            }
            workflow["11"]["inputs"]["model"] = ["20", 0]
            frames[name] = _frames(client, workflow, tmp_path / name)
    assert np.array_equal(frames[placed.name], frames[tiny_models.diffusion_model.name])


def test_checkpoint_without_vae_names_the_file(
    comfy_server: ComfyServer, workspace: Workspace, tiny_models: FixtureSet, tiny_workflow: dict[str, Any]
) -> None:
    source = tiny_models.checkpoint
    dit_only = {key: t for key, t in read_tensors(source).items() if not key.startswith("vae.")}
    placed = workspace.models_dir / "checkpoints" / "test-no-vae.safetensors"
    save_file(dit_only, str(placed), read_header(source).metadata)
    workflow = _lossless(tiny_workflow, "test-int8-ckpt/no-vae")
    workflow["1"] = {"class_type": NODE_ID, "inputs": {"ckpt_name": placed.name, **SHARED_INPUTS}}
    workflow["12"]["inputs"]["vae"] = ["1", 1]
    with (
        ComfyClient(comfy_server.url) as client,
        _removed_after(placed),
        pytest.raises(PromptFailedError) as failed,
    ):
        run_prompt(client, workflow, timeout=300)
    message = str(failed.value)
    print(message)
    assert placed.name in message and "holds no VAE" in message and "'vae.'" in message


def test_int8_copy_of_the_tiny_checkpoint_keeps_its_vae(tiny_models: FixtureSet) -> None:
    """The demo's INT8 checkpoint: the DiT part in LeanVideo INT8, the VAE and the config as they were."""
    from leanvideo.int8.formats import read_int8_file

    source, copy = tiny_models.checkpoint, tiny_models.int8_checkpoint
    header = read_header(copy)
    dit_keys = [key for key in header.dtypes if key.startswith("model.diffusion_model.")]
    assert read_int8_file(copy, dit_keys).format == "leanvideo"
    assert sum(dtype == "I8" for dtype in header.dtypes.values()) >= 2 * 10  # 10 layers per block
    assert header.metadata["config"] == read_header(source).metadata["config"]
    vae_keys = [key for key in header.dtypes if key.startswith("vae.")]
    original = read_tensors(source, vae_keys)
    assert vae_keys and all(t.equal(original[key]) for key, t in read_tensors(copy, vae_keys).items())
    assert copy.stat().st_size < source.stat().st_size


@pytest.mark.parametrize("kind", ["int8", "scaled_fp8"])
def test_dit_loader_reads_only_the_diffusion_model_of_a_full_checkpoint(
    comfy: SimpleNamespace, tiny_models: FixtureSet, tmp_path: Path, kind: str
) -> None:
    """An INT8 and a scaled-fp8 full checkpoint, whose VAE part also holds a tensor no INT8 format
    allows: the DiT loader detects, checks and quantizes the diffusion model part only."""
    from leanvideo.int8.fp8 import to_fp8

    source = tiny_models.int8_checkpoint if kind == "int8" else tiny_models.checkpoint
    tensors = read_tensors(source)
    if kind == "scaled_fp8":
        prefix = "model.diffusion_model."
        dit = {key[len(prefix) :]: t for key, t in tensors.items() if key.startswith(prefix)}
        stored, _ = to_fp8(dit, "scaled", prefix)
        tensors = {**{k: t for k, t in tensors.items() if not k.startswith(prefix)}, **stored}
    tensors["vae.stray.weight"] = torch.zeros(4, 4, dtype=torch.uint8)
    path = tmp_path / f"full-{kind}.safetensors"
    save_file(tensors, str(path), read_header(source).metadata)
    patcher = comfy.loading.load_diffusion_model_int8(path)
    assert comfy.ops.is_int8(patcher.model.diffusion_model.transformer_blocks[0].attn1.to_q.weight)
    assert not comfy.ops.is_int8(patcher.model.diffusion_model.proj_out.weight)


def test_checkpoint_loader_detects_the_model_once_before_comfyui(
    comfy: SimpleNamespace, tiny_models: FixtureSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quantizing a float checkpoint on load: our detection (VAE prefix, family) runs once, then
    ComfyUI's own when it builds the model — not a second time for the family."""
    from comfy import model_detection
    from leanvideo.int8_checkpoint import load_checkpoint_int8

    calls: list[str] = []
    detect = model_detection.model_config_from_unet

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return detect(*args, **kwargs)

    monkeypatch.setattr(model_detection, "model_config_from_unet", counted)
    model, vae = load_checkpoint_int8(tiny_models.checkpoint)
    assert comfy.ops.is_int8(model.model.diffusion_model.transformer_blocks[0].attn1.to_q.weight)
    assert vae is not None
    assert len(calls) == 2, calls


def test_a_file_given_to_the_wrong_loader_is_named_for_what_it_is(
    comfy: SimpleNamespace, tiny_models: FixtureSet
) -> None:
    from leanvideo.int8.spec import Int8FormatError

    loading = comfy.loading
    cases = (
        (loading.load_diffusion_model_int8, tiny_models.lora, "a LoRA (key "),
        (loading.load_diffusion_model_int8, tiny_models.text_encoder, "a text encoder; load it with"),
        (loading.load_diffusion_model_int8, tiny_models.int8_text_encoder, "a text encoder; load it with"),
    )
    for load, path, message in cases:
        with pytest.raises(Int8FormatError, match=re.escape(f"{path}: {message}")):
            load(path)
    with pytest.raises(Int8FormatError, match=re.escape(f"{tiny_models.diffusion_model}: an LTXV diffusion")):
        loading.load_text_encoder_int8([tiny_models.diffusion_model], "ltxv")
    checkpoint = f"{tiny_models.checkpoint}: an LTXV checkpoint (diffusion model and VAE); load it with Load "
    with pytest.raises(Int8FormatError, match=re.escape(checkpoint + "Checkpoint (INT8)")):
        loading.load_text_encoder_int8([tiny_models.checkpoint], "ltxv")
    # INT8 files too: ComfyUI would load nothing of them and run the encoder with empty weights
    int8_checkpoint = tiny_models.int8_checkpoint
    with pytest.raises(Int8FormatError, match=re.escape(f"{int8_checkpoint}: an LTXV checkpoint")):
        loading.load_text_encoder_int8([int8_checkpoint], "ltxv")
    with pytest.raises(Int8FormatError, match=re.escape(f"{tiny_models.lora}: a LoRA (key ")):
        loading.load_text_encoder_int8([tiny_models.lora], "ltxv")


def test_the_text_encoder_can_be_kept_on_the_cpu_as_load_clip_does(
    comfy: SimpleNamespace, tiny_models: FixtureSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``device: cpu`` gives ComfyUI the CPU as load and offload device, as Load CLIP does."""
    from comfy import sd as comfy_sd

    seen: list[dict[str, Any]] = []
    real = comfy_sd.load_text_encoder_state_dicts

    def spy(*args: Any, model_options: dict[str, Any], **kwargs: Any) -> Any:
        seen.append(dict(model_options))
        return real(*args, model_options=model_options, **kwargs)

    monkeypatch.setattr(comfy_sd, "load_text_encoder_state_dicts", spy)
    clip = comfy.loading.load_text_encoder_int8(
        [tiny_models.int8_text_encoder], "stable_diffusion", on_cpu=True
    )
    comfy.loading.load_text_encoder_int8([tiny_models.int8_text_encoder], "stable_diffusion")
    assert seen[0]["load_device"] == seen[0]["offload_device"] == torch.device("cpu")
    assert "load_device" not in seen[1]
    assert clip.patcher.load_device == torch.device("cpu")


def test_the_report_says_when_comfyui_computes_in_another_dtype(
    comfy: SimpleNamespace, tiny_models: FixtureSet
) -> None:
    """compute_dtype bf16 on a CPU: ComfyUI casts to fp32 there, and the loader's report says so."""
    from leanvideo.int8_kernels import compute_dtype_note

    options = comfy.loading.Int8LoadOptions(compute_dtype="bf16")
    model = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model, options).model
    note = compute_dtype_note(torch.bfloat16, model)
    if torch.cuda.is_available():
        assert note is None
    else:
        assert note == (
            "compute dtype: bfloat16 asked; ComfyUI computes in float32 on this device "
            "(weights held in bfloat16)"
        )
    assert compute_dtype_note(None, model) is None
