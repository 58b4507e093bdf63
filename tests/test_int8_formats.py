"""INT8 file formats: detection and reading of every supported layout, streaming quantization with
its round trip, family rules, and the bad-input errors (each naming the file and the tensor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, dequantize, sqnr_db
from leanvideo.int8.convert import quantize_file, quantize_state_dict
from leanvideo.int8.export import to_layout
from leanvideo.int8.formats import read_int8_file
from leanvideo.int8.formats.common import config_from_tensor
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.spec import Int8FormatError
from safetensors.torch import save_file


def _ltxv_like() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    tensors = {"patchify_proj.weight": normal(64, 128), "proj_out.weight": normal(128, 64)}
    tensors["adaln_single.linear.weight"] = normal(384, 64)
    for block in range(2):
        prefix = f"transformer_blocks.{block}."
        for name in ("attn1.to_q", "attn1.to_k", "attn2.to_out.0"):
            tensors[prefix + name + ".weight"] = normal(64, 64)
            tensors[prefix + name + ".bias"] = normal(64)
        tensors[prefix + "attn1.q_norm.weight"] = normal(64)
        tensors[prefix + "ff.net.0.proj.weight"] = normal(256, 64)
        tensors[prefix + "ff.net.2.weight"] = normal(64, 256)
    return tensors


QUANTIZED_LAYERS = {
    f"transformer_blocks.{b}.{n}"
    for b in range(2)
    for n in ("attn1.to_q", "attn1.to_k", "attn2.to_out.0", "ff.net.0.proj", "ff.net.2")
}


def test_ltxv_rules_keep_first_last_modulation_and_norms() -> None:
    shapes = {key: tuple(t.shape) for key, t in _ltxv_like().items()}
    plan = plan_quantization(shapes, "ltxv", Int8WeightConfig(convrot=True))
    assert set(plan) == QUANTIZED_LAYERS
    assert plan["transformer_blocks.0.ff.net.2"].convrot  # 256 input columns: rotation fits
    assert not plan["transformer_blocks.0.attn1.to_q"].convrot  # 64 input columns: dropped
    with pytest.raises(Int8FormatError, match="'sdxl'"):
        plan_quantization(shapes, "sdxl", Int8WeightConfig())


@pytest.mark.parametrize("layout", ["comfy_native", "comfy_native_header", "lightx2v", "int8_fast"])
def test_every_layout_reads_back_to_the_same_weights(tmp_path: Path, layout: str) -> None:
    source = _ltxv_like()
    granularity = "tensor" if layout == "int8_fast" else "row"
    plan = plan_quantization(
        {k: tuple(v.shape) for k, v in source.items()}, "ltxv", Int8WeightConfig(granularity)
    )
    canonical = quantize_state_dict(source, plan)
    tensors, metadata = to_layout(canonical, layout, {"config": "{}"})
    path = tmp_path / f"{layout}.safetensors"
    save_file(tensors, str(path), metadata)

    loaded = read_int8_file(path)
    expected_format = "comfy_native" if layout.startswith("comfy") else layout
    assert loaded.format == expected_format
    assert loaded.metadata == {"config": "{}"}
    for layer in QUANTIZED_LAYERS:
        config = Int8WeightConfig.from_dict(
            config_from_tensor(loaded.tensors[layer + ".comfy_quant"], where=layer), where=layer
        )
        restored = dequantize(
            loaded.tensors[layer + ".weight"], loaded.tensors[layer + ".weight_scale"], config
        )
        measured = sqnr_db(source[layer + ".weight"], restored)
        assert measured > (30.0 if granularity == "tensor" else 38.0), (layer, measured)
    assert torch.equal(loaded.tensors["proj_out.weight"], source["proj_out.weight"])


def test_our_format_round_trips_through_quantize_file(tmp_path: Path) -> None:
    source_path, target = tmp_path / "dit.safetensors", tmp_path / "dit-int8.safetensors"
    source = _ltxv_like()
    save_file(source, str(source_path), {"config": '{"transformer": {}}'})
    seen: list[int] = []
    report = quantize_file(
        source_path,
        target,
        family="ltxv",
        config=Int8WeightConfig(convrot=True),
        progress=lambda k, d, t: seen.append(d),
    )
    print(f"size ratio {report.size_ratio:.3f}, min layer SQNR {min(report.layer_sqnr_db.values()):.2f} dB")
    assert report.verified and seen[-1] == len(source)
    assert set(report.layer_sqnr_db) == QUANTIZED_LAYERS
    assert min(report.layer_sqnr_db.values()) > 38.0
    loaded = read_int8_file(target)
    assert loaded.format == "leanvideo"
    assert loaded.metadata["config"] == '{"transformer": {}}'
    native = json.loads(loaded_header_entry(target))
    assert native["layers"]["transformer_blocks.0.ff.net.2"] == {
        "format": "int8_rowwise",
        "convrot": True,
        "convrot_groupsize": 256,
    }
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        quantize_file(source_path, target, family="ltxv")
    assert not list(tmp_path.glob("*.partial"))


def loaded_header_entry(path: Path) -> str:
    from leanvideo.int8.files import read_header

    return read_header(path).metadata["_quantization_metadata"]


def _write_bad(tmp_path: Path, tensors: dict[str, torch.Tensor], name: str = "bad.safetensors") -> Path:
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def test_bad_inputs_name_the_file_and_the_tensor(tmp_path: Path) -> None:
    weight = torch.zeros(8, 16, dtype=torch.int8)
    no_scale = _write_bad(tmp_path, {"blocks.0.q.weight": weight})
    with pytest.raises(Int8FormatError, match=r"bad\.safetensors.*'blocks\.0\.q\.weight' has no scale"):
        read_int8_file(no_scale)
    wrong = _write_bad(
        tmp_path, {"blocks.0.q.weight": weight, "blocks.0.q.weight_scale": torch.ones(3)}, "w.safetensors"
    )
    with pytest.raises(Int8FormatError, match=r"w\.safetensors.*'blocks\.0\.q\.weight'.*shape \[3\]"):
        read_int8_file(wrong)
    fp8 = _write_bad(tmp_path, {"x.weight": torch.zeros(4, 4).to(torch.float8_e4m3fn)}, "fp8.safetensors")
    with pytest.raises(Int8FormatError, match=r"fp8\.safetensors.*'x\.weight'.*F8_E4M3"):
        read_int8_file(fp8)
    unknown = tmp_path / "n.safetensors"
    save_file(
        {"w.weight": weight, "w.weight_scale": torch.ones(8, 1)},
        str(unknown),
        {"_quantization_metadata": '{"layers": {"w": {"format": "float8_e4m3fn"}}}'},
    )
    with pytest.raises(Int8FormatError, match="'float8_e4m3fn'"):
        read_int8_file(unknown)


def test_corrupt_truncated_and_pickle_files_are_refused(tmp_path: Path) -> None:
    good = _write_bad(tmp_path, {"a.weight": torch.randn(64, 64)}, "good.safetensors")
    data = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-100])
    with pytest.raises(Int8FormatError, match=r"truncated\.safetensors: not a readable safetensors file"):
        read_int8_file(truncated)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(Int8FormatError, match=r"corrupt\.safetensors: not a readable"):
        read_int8_file(corrupt)
    pickle = tmp_path / "model.ckpt"
    torch.save({"a": torch.zeros(1)}, pickle)
    with pytest.raises(Int8FormatError, match=r"model\.ckpt: pickle checkpoints"):
        read_int8_file(pickle)


def test_text_encoder_rules_quantize_clip_and_t5_projections_only() -> None:
    shapes = {
        "text_model.encoder.layers.0.self_attn.q_proj.weight": (768, 768),
        "text_model.encoder.layers.0.mlp.fc1.weight": (3072, 768),
        "text_model.encoder.layers.0.layer_norm1.weight": (768,),
        "text_model.embeddings.token_embedding.weight": (49408, 768),
        "text_projection.weight": (768, 768),
        "encoder.block.0.layer.0.SelfAttention.q.weight": (4096, 4096),
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": (32, 64),
        "encoder.block.0.layer.1.DenseReluDense.wi_0.weight": (10240, 4096),
        "shared.weight": (32128, 4096),
    }
    plan = plan_quantization(shapes, "text_encoder", Int8WeightConfig())
    assert set(plan) == {
        "text_model.encoder.layers.0.self_attn.q_proj",
        "text_model.encoder.layers.0.mlp.fc1",
        "encoder.block.0.layer.0.SelfAttention.q",
        "encoder.block.0.layer.1.DenseReluDense.wi_0",
    }
