"""ConvRot (``convrot`` layer entries) means one thing in every file: comfy-kitchen's regular Hadamard.

A ComfyUI-native INT8 file whose layers comfy-kitchen rotated reads back to the original weights; a
file we write with ``--convrot`` is dequantized correctly by comfy-kitchen; and LeanVideo files of
format version 1, rotated with the Sylvester matrix, still read correctly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, dequantize, quantize_weight, sqnr_db
from leanvideo.int8.convert import int8_metadata, quantize_file
from leanvideo.int8.formats import read_int8_file
from leanvideo.int8.formats.common import config_to_tensor
from leanvideo.int8.spec import COMFY_METADATA_KEY, METADATA_KEY
from safetensors.torch import save_file

LAYER = "transformer_blocks.0.attn1.to_q"
MIN_SQNR_DB = 35.0  # row-wise INT8 of a rotated Gaussian weight: ≈ 40 dB


def _weight(out_features: int = 96, in_features: int = 512) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.02
    weight[:, 5] *= 30.0  # an outlier input channel: what rotation is for
    return weight


def _read_back(path: Path) -> tuple[Int8WeightConfig, torch.Tensor]:
    loaded = read_int8_file(path)
    entry = json.loads(bytes(loaded.tensors[LAYER + ".comfy_quant"].tolist()).decode())
    config = Int8WeightConfig.from_dict(entry, where=LAYER)
    restored = dequantize(loaded.tensors[LAYER + ".weight"], loaded.tensors[LAYER + ".weight_scale"], config)
    return config, restored


def test_a_comfy_kitchen_convrot_layer_reads_back_to_its_weight(tmp_path: Path) -> None:
    kitchen = pytest.importorskip("comfy_kitchen.backends.eager.quantization", reason="comfy-kitchen missing")
    weight = _weight()
    qdata, scale = kitchen.quantize_int8_convrot_weight(weight, 256)
    entry = {"format": "int8_rowwise", "convrot": True, "convrot_groupsize": 256}
    path = tmp_path / "comfy-native-convrot.safetensors"
    tensors = {
        LAYER + ".weight": qdata.contiguous(),
        LAYER + ".weight_scale": scale.reshape(-1, 1).float(),
        LAYER + ".comfy_quant": torch.tensor(list(json.dumps(entry).encode()), dtype=torch.uint8),
    }
    save_file(tensors, str(path))
    config, restored = _read_back(path)
    assert read_int8_file(path).format == "comfy_native" and config.convrot and config.hadamard == "regular"
    measured = sqnr_db(weight, restored)
    print(f"comfy-kitchen ConvRot layer read by LeanVideo: {measured:.2f} dB")
    assert measured >= MIN_SQNR_DB


def test_our_convrot_layer_is_dequantized_right_by_comfy_kitchen(tmp_path: Path) -> None:
    kitchen = pytest.importorskip("comfy_kitchen.backends.eager.quantization", reason="comfy-kitchen missing")
    weight = _weight()
    source, target = tmp_path / "float.safetensors", tmp_path / "int8.safetensors"
    save_file({LAYER + ".weight": weight.to(torch.bfloat16)}, str(source))
    quantize_file(source, target, family="ltxv", config=Int8WeightConfig(convrot=True))
    loaded = read_int8_file(target)
    scale = loaded.tensors[LAYER + ".weight_scale"]
    theirs = kitchen.dequantize_int8_convrot_weight(
        loaded.tensors[LAYER + ".weight"], scale.reshape(-1, 1), 256
    )
    measured = sqnr_db(weight, theirs)
    print(f"LeanVideo ConvRot layer dequantized by comfy-kitchen: {measured:.2f} dB")
    assert measured >= MIN_SQNR_DB - 1.0  # bf16 source


def test_format_version_1_files_keep_their_sylvester_rotation(tmp_path: Path) -> None:
    weight = _weight(in_features=256)
    legacy = Int8WeightConfig(convrot=True, convrot_group=128, hadamard="sylvester")  # a v1 group size too
    packed = quantize_weight(weight, legacy)
    entry = {k: v for k, v in legacy.to_dict().items() if k != "hadamard"}  # as version 1 wrote it
    metadata = int8_metadata({}, {})
    metadata[METADATA_KEY] = json.dumps({"format_version": 1})
    metadata[COMFY_METADATA_KEY] = json.dumps({"format_version": "1.0", "layers": {LAYER: entry}})
    path = tmp_path / "leanvideo-v1.safetensors"
    tensors = {
        LAYER + ".weight": packed.qdata,
        LAYER + ".weight_scale": packed.scale,
        LAYER + ".comfy_quant": torch.tensor(list(json.dumps(entry).encode()), dtype=torch.uint8),
    }
    save_file(tensors, str(path), metadata)
    config, restored = _read_back(path)
    assert config.hadamard == "sylvester" and config.convrot_group == 128
    assert sqnr_db(weight, restored) >= MIN_SQNR_DB
    # the in-memory entry says so, so ComfyUI-side code that re-reads it rotates the same way
    assert json.loads(bytes(config_to_tensor(config).tolist()).decode())["hadamard"] == "sylvester"
    current = Int8WeightConfig(convrot=True)
    assert "hadamard" not in current.to_dict()  # files written now carry ComfyUI's plain entry
