"""fp8 in, INT8 out (`leanvideo quantize`): float8_e4m3fn, float8_e5m2 and ComfyUI's scaled fp8 (a scale
per tensor or per output channel, scale_input, the scaled_fp8 marker) are dequantized exactly before
quantizing; the report's SQNR is against those dequantized weights; no scaled-fp8 key is left behind.
The loaders, against stock ComfyUI running the same fp8 file: tests/test_int8_comfy.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from leanvideo.int8 import dequantize
from leanvideo.int8.convert import quantize_file
from leanvideo.int8.formats import read_int8_file
from leanvideo.int8.formats.common import config_from_tensor
from leanvideo.int8.fp8 import dequantize_fp8, is_fp8_companion, to_fp8
from leanvideo.int8.quantize import sqnr_db
from leanvideo.int8.spec import Int8FormatError, Int8WeightConfig
from safetensors.torch import save_file

from tests.test_int8_formats import QUANTIZED_LAYERS, _ltxv_like

PREFIX = "model.diffusion_model."


def fp8_file(path: Path, kind: str) -> dict[str, torch.Tensor]:
    """The tiny LTXV-like DiT in fp8 with the release key prefix; returns its exact float32 weights."""
    stored, exact = to_fp8(_ltxv_like(), kind, PREFIX)
    save_file(stored, str(path), {"config": '{"transformer": {}}'})
    return exact


@pytest.mark.parametrize("kind", ["e4m3", "e5m2", "scaled", "scaled_channel"])
def test_fp8_files_quantize_against_their_exact_weights(tmp_path: Path, kind: str) -> None:
    source, target = tmp_path / f"dit-{kind}.safetensors", tmp_path / f"dit-{kind}-int8.safetensors"
    exact = fp8_file(source, kind)
    report = quantize_file(source, target, family="ltxv", config=Int8WeightConfig())
    print(f"{kind}: min layer SQNR {min(report.layer_sqnr_db.values()):.2f} dB against the fp8 weights")
    assert report.verified and set(report.layer_sqnr_db) == {PREFIX + layer for layer in QUANTIZED_LAYERS}
    loaded = read_int8_file(target)
    assert loaded.format == "leanvideo" and loaded.metadata["config"] == '{"transformer": {}}'
    assert not [key for key in loaded.tensors if is_fp8_companion(key)]
    for layer in QUANTIZED_LAYERS:
        key = PREFIX + layer
        config = Int8WeightConfig.from_dict(
            config_from_tensor(loaded.tensors[key + ".comfy_quant"], where=layer), where=layer
        )
        restored = dequantize(loaded.tensors[key + ".weight"], loaded.tensors[key + ".weight_scale"], config)
        measured = sqnr_db(exact[layer + ".weight"], restored)
        assert measured == pytest.approx(report.layer_sqnr_db[key], abs=0.01)  # the report's reference
        assert measured > 38.0
    # fp8 weights the LTXV rules keep in float are written as their exact float32 values
    kept = loaded.tensors[PREFIX + "patchify_proj.weight"]
    assert kept.dtype == torch.float32 and torch.equal(kept, exact["patchify_proj.weight"])
    assert loaded.tensors[PREFIX + "transformer_blocks.0.attn1.q_norm.weight"].dtype == torch.bfloat16


def test_a_scale_of_the_wrong_shape_is_named() -> None:
    weight = torch.zeros(4, 8).to(torch.float8_e4m3fn)
    with pytest.raises(Int8FormatError, match=r"blocks.0.q.weight: scale_weight has shape \(3,\)"):
        dequantize_fp8(weight, torch.ones(3), where="blocks.0.q.weight")
    assert torch.equal(dequantize_fp8(weight, torch.ones(4, 1), where="w"), torch.zeros(4, 8))


def test_other_dtypes_are_still_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "ints.safetensors"
    save_file({"transformer_blocks.0.attn1.to_q.weight": torch.zeros(4, 4, dtype=torch.int16)}, str(path))
    with pytest.raises(Int8FormatError, match=r"'transformer_blocks.0.attn1.to_q.weight' is I16; only float"):
        quantize_file(path, tmp_path / "out.safetensors", family="ltxv")
