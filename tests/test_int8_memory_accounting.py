"""ComfyUI's memory accounting of INT8 models (pinned ComfyUI in-process, CPU).

ComfyUI decides what to free, offload and load partially from ``ModelPatcher.model_size()`` and
the per-layer ``model_management.module_size``; both must equal the bytes the model really holds:
int8 weights, their scales and every float tensor. A text encoder once counted only its embeddings
(its INT8 weights arrive after ComfyUI had measured it), and no model counted its scales.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig
from leanvideo.int8.convert import quantize_file, quantize_state_dict
from leanvideo.int8.export import to_layout
from leanvideo.int8.files import read_header, read_tensors
from leanvideo.int8.policy import plan_quantization
from safetensors.torch import save_file

from runner.fixtures import FixtureSet

pytestmark = pytest.mark.integration


def _resident_bytes(comfy: SimpleNamespace, model: torch.nn.Module) -> int:
    """What ``model`` really holds: int8 data + scale of each INT8 weight, every other tensor."""
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if comfy.ops.is_int8(tensor):
            total += tensor._qdata.nbytes + tensor._layout_params["scale"].nbytes
        else:
            total += tensor.nbytes
    return total


def _assert_accounted(comfy: SimpleNamespace, patcher: Any) -> int:
    """ComfyUI's size of ``patcher`` and its loaded bytes after a load both equal the real bytes."""
    resident = _resident_bytes(comfy, patcher.model)
    assert patcher.model_size() == resident
    comfy.mm.load_models_gpu([patcher])
    assert patcher.loaded_size() == resident
    loaded = comfy.mm.current_loaded_models
    assert sum(m.model is not None and m.model.model is patcher.model for m in loaded) == 1
    assert not any(m.is_dead() for m in loaded)  # no stale entry left behind
    return resident


def test_text_encoder_counts_its_int8_weights(
    comfy: SimpleNamespace, tiny_models: FixtureSet, tmp_path: Path
) -> None:
    quantized = tmp_path / "clip_l-int8.safetensors"
    quantize_file(tiny_models.text_encoder, quantized, family="text_encoder")
    for path in (tiny_models.text_encoder, quantized):  # quantized on load, then pre-quantized
        clip = comfy.loading.load_text_encoder_int8([path], "stable_diffusion")
        layer = clip.cond_stage_model.clip_l.transformer.text_model.encoder.layers[0].mlp.fc1
        assert comfy.ops.is_int8(layer.weight)
        resident = _assert_accounted(comfy, clip.patcher)
        assert clip.clone().patcher.model_size() == resident
        print(f"CLIP-L INT8 ({path.name}): ComfyUI counts {resident} B")


@pytest.mark.parametrize("layout", ["float", "leanvideo", "comfy_native", "lightx2v"])
def test_diffusion_model_counts_scales(
    comfy: SimpleNamespace, tiny_models: FixtureSet, tmp_path: Path, layout: str
) -> None:
    path = tiny_models.diffusion_model
    if layout == "leanvideo":  # blocks of 32 columns: the most scale bytes of any granularity
        path = tmp_path / "dit-leanvideo.safetensors"
        config = Int8WeightConfig(granularity="block", block_size=32)
        quantize_file(tiny_models.diffusion_model, path, family="ltxv", config=config)
    elif layout != "float":
        tensors = read_tensors(path)
        plan = plan_quantization({k: tuple(v.shape) for k, v in tensors.items()}, "ltxv", Int8WeightConfig())
        written, metadata = to_layout(quantize_state_dict(tensors, plan), layout, read_header(path).metadata)
        path = tmp_path / f"dit-{layout}.safetensors"
        save_file(written, str(path), metadata)
    patcher = comfy.loading.load_diffusion_model_int8(path)
    _assert_accounted(comfy, patcher)
    # Low-VRAM decisions size each layer on its own: int8 data + scale + bias.
    layer = patcher.model.diffusion_model.transformer_blocks[0].attn1.to_q
    data, scale = layer.weight._qdata, layer.weight._layout_params["scale"]
    assert comfy.mm.module_size(layer) == data.nbytes + scale.nbytes + layer.bias.nbytes


def test_lora_and_merges_keep_the_accounting(comfy: SimpleNamespace, tiny_models: FixtureSet) -> None:
    patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model)
    resident = _resident_bytes(comfy, patcher.model)
    lora = comfy.utils.load_torch_file(str(tiny_models.lora))
    with_lora = patcher.clone()
    with_lora.add_patches(comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(patcher.model, {})), 1.0)
    assert _assert_accounted(comfy, with_lora) == resident  # merged LoRA: requantized, same sizes
    with_lora.unpatch_model()

    # A model merge hands every state-dict key over as a patch, the listed scales included; they
    # follow their weights instead of being patched on their own.
    other = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model)
    merged = patcher.clone()
    patches = other.get_key_patches("diffusion_model.")
    assert any(key.endswith(".weight_scale") for key in patches)
    for key, patch in patches.items():
        merged.add_patches({key: patch}, 0.5, 0.5)
    assert _assert_accounted(comfy, merged) == resident
    merged.unpatch_model()
