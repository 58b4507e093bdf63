"""The INT8 loader nodes as the real server declares them, and the INT8 text encoder node in the tiny
LTXV workflow (its frames compared with the fp16 CLIP-L run)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from runner.local.server import ComfyServer
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
    assert required["path"][1]["options"] == ["auto", "w8a16", "w8a8"]


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
