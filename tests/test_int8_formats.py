"""INT8 file formats: detection and reading of every supported layout, streaming quantization with
its round trip, family rules, auxiliary byte blobs (a text encoder's tokenizer) passed through, and the
bad-input errors (each naming the file and the tensor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, dequantize, sqnr_db
from leanvideo.int8.convert import quantize_file, quantize_state_dict
from leanvideo.int8.export import to_layout
from leanvideo.int8.files import read_header
from leanvideo.int8.formats import check_int8_header, read_int8_file
from leanvideo.int8.formats.common import config_from_tensor, config_to_tensor
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.spec import METADATA_KEY, Int8FormatError
from safetensors.torch import save_file

from runner.local.workspace import Workspace


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
    return read_header(path).metadata["_quantization_metadata"]


def _write_bad(tmp_path: Path, tensors: dict[str, torch.Tensor], name: str = "bad.safetensors") -> Path:
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def test_bad_inputs_name_the_file_and_the_tensor(tmp_path: Path) -> None:
    """Each refusal is said alike by the reader and by the header-only check (`models check` runs that)."""
    weight = torch.zeros(8, 16, dtype=torch.int8)
    no_scale = _write_bad(tmp_path, {"blocks.0.q.weight": weight})
    wrong = _write_bad(
        tmp_path, {"blocks.0.q.weight": weight, "blocks.0.q.weight_scale": torch.ones(3)}, "w.safetensors"
    )
    odd = _write_bad(tmp_path, {"x.weight": torch.zeros(4, 4, dtype=torch.int16)}, "i16.safetensors")
    packed = _write_bad(
        tmp_path,
        {"a.weight": torch.randn(4, 4), "k.weight": torch.zeros(2, 4, dtype=torch.uint8)},
        "u8.safetensors",
    )
    unknown = tmp_path / "n.safetensors"
    save_file(
        {"w.weight": weight, "w.weight_scale": torch.ones(8, 1)},
        str(unknown),
        {"_quantization_metadata": '{"layers": {"w": {"format": "float8_e4m3fn"}}}'},
    )
    newer = tmp_path / "v9.safetensors"
    save_file(
        {"w.weight": weight, "w.weight_scale": torch.ones(8, 1)},
        str(newer),
        {METADATA_KEY: '{"format_version": 9}'},
    )
    refused = {
        no_scale: r"bad\.safetensors.*'blocks\.0\.q\.weight' has no scale",
        wrong: r"w\.safetensors.*'blocks\.0\.q\.weight'.*shape \[3\]",
        odd: r"i16\.safetensors.*'x\.weight'.*I16",
        packed: r"u8\.safetensors: uint8 tensor 'k\.weight' is named like a layer",
        unknown: "'float8_e4m3fn'",
        newer: r"v9\.safetensors: LeanVideo INT8 format version 9 is newer than this pack reads",
    }
    for path, said in refused.items():
        for read in (read_int8_file, check_int8_header):
            with pytest.raises(Int8FormatError, match=said):
                read(path)
    fp8 = _write_bad(tmp_path, {"x.weight": torch.zeros(4, 4).to(torch.float8_e4m3fn)}, "fp8.safetensors")
    assert read_int8_file(fp8).format == "fp8" == check_int8_header(fp8)  # the loaders quantize it


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


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "the file is empty (0 bytes)"),
        (b"<!DOCTYPE html><html><body>Sign in to continue</body></html>", "a web page or other text"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n", "a Git LFS pointer"),
        (None, "it is cut short"),
        (b'\x00\x10\x00\x00\x00\x00\x00\x00{"a.weight": {"dtype"', "it is cut short inside its header"),
    ],
    ids=["empty", "web-page", "lfs-pointer", "cut-short", "cut-in-header"],
)
def test_a_damaged_download_is_said_to_be_one(tmp_path: Path, content: bytes | None, said: str) -> None:
    """What users' broken files are: said so an artist knows to download again, not as parser jargon."""
    path = tmp_path / "model.safetensors"
    if content is None:
        good = _write_bad(tmp_path, {"a.weight": torch.randn(64, 64)}, "good.safetensors")
        content = good.read_bytes()[:-1000]
    path.write_bytes(content)
    with pytest.raises(Int8FormatError) as raised:
        read_int8_file(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: not a readable safetensors file") and said in message, message
    if said == "it is cut short":
        assert f"({len(content)} bytes of the {len(content) + 1000} its header says)" in message


def test_a_cut_short_file_whose_header_length_reads_as_text_is_still_cut_short(tmp_path: Path) -> None:
    """A header 0x17B bytes long (a writer that does not pad it) starts the file with b"{\\x01": a
    cut-off model, not a web page."""
    entry = '{"w":{"dtype":"F32","shape":[64,64],"data_offsets":[0,16384]}}'
    text = entry[:-1] + ',"__metadata__":{"x":"' + "y" * (0x17B - len(entry) - 24) + '"}}'
    raw = text.encode()
    assert len(raw) == 0x17B, len(raw)
    data = len(raw).to_bytes(8, "little") + raw + torch.randn(64, 64).numpy().tobytes()
    assert data[:2] == b"{\x01"
    path = tmp_path / "model.safetensors"
    path.write_bytes(data[:-1000])
    with pytest.raises(Int8FormatError, match="it is cut short"):
        read_int8_file(path)


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


# --- auxiliary byte blobs: a text encoder's tokenizer travels in the file (Comfy-Org's UMT5-XXL) ---


@pytest.fixture(scope="module")
def spiece_model(workspace: Workspace) -> torch.Tensor:
    """A real SentencePiece model (the pinned ComfyUI's T5 tokenizer) as the uint8 tensor files carry."""
    data = (workspace.comfyui_dir / "comfy/text_encoders/t5_pile_tokenizer/tokenizer.model").read_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _umt5_like(spiece_model: torch.Tensor) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.float16)

    tensors = {"shared.weight": normal(100, 64), "encoder.final_layer_norm.weight": normal(64)}
    for block in range(2):
        prefix = f"encoder.block.{block}.layer."
        for name in ("q", "k", "v", "o"):
            tensors[f"{prefix}0.SelfAttention.{name}.weight"] = normal(64, 64)
        tensors[prefix + "1.DenseReluDense.wi_0.weight"] = normal(128, 64)
        tensors[prefix + "1.DenseReluDense.wo.weight"] = normal(64, 128)
    return {**tensors, "spiece_model": spiece_model}


@pytest.mark.integration
def test_float_file_with_a_tokenizer_blob_reads_as_float(tmp_path: Path, spiece_model: torch.Tensor) -> None:
    path = _write_bad(tmp_path, _umt5_like(spiece_model), "umt5.safetensors")
    loaded = read_int8_file(path)
    assert loaded.format == "float"
    assert torch.equal(loaded.tensors["spiece_model"], spiece_model)


@pytest.mark.integration
def test_quantize_file_copies_the_tokenizer_blob_and_the_result_loads(
    tmp_path: Path, spiece_model: torch.Tensor
) -> None:
    source, target = tmp_path / "umt5.safetensors", tmp_path / "umt5-int8.safetensors"
    save_file(_umt5_like(spiece_model), str(source))
    report = quantize_file(source, target, family="text_encoder")
    assert report.verified and len(report.layer_sqnr_db) == 12
    assert read_header(target).dtypes["spiece_model"] == "U8"
    loaded = read_int8_file(target)
    assert loaded.format == "leanvideo"
    assert loaded.tensors["spiece_model"].numpy().tobytes() == spiece_model.numpy().tobytes()
    assert loaded.tensors["encoder.block.0.layer.0.SelfAttention.q.weight"].dtype == torch.int8


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["comfy_native", "comfy_native_header", "lightx2v", "int8_fast"])
def test_pre_quantized_files_with_a_tokenizer_blob_load(
    tmp_path: Path, spiece_model: torch.Tensor, layout: str
) -> None:
    source = _umt5_like(spiece_model)
    config = Int8WeightConfig("tensor" if layout == "int8_fast" else "row")
    plan = plan_quantization({k: tuple(v.shape) for k, v in source.items()}, "text_encoder", config)
    tensors, metadata = to_layout(quantize_state_dict(source, plan), layout)
    path = tmp_path / f"{layout}.safetensors"
    save_file(tensors, str(path), metadata)
    loaded = read_int8_file(path)
    assert loaded.format == ("comfy_native" if layout.startswith("comfy") else layout)
    assert torch.equal(loaded.tensors["spiece_model"], spiece_model)


@pytest.mark.integration
def test_blobs_do_not_hide_real_errors(tmp_path: Path, spiece_model: torch.Tensor) -> None:
    float_te = _umt5_like(spiece_model)
    q, k = (f"encoder.block.0.layer.0.SelfAttention.{name}.weight" for name in ("q", "k"))
    no_scale = {**float_te, q: torch.zeros(64, 64, dtype=torch.int8)}
    with pytest.raises(Int8FormatError, match=rf"int8 weight '{q}' has no scale"):
        read_int8_file(_write_bad(tmp_path, no_scale, "no-scale.safetensors"))
    packed_4bit = {**float_te, k: torch.zeros(32, 64, dtype=torch.uint8)}
    with pytest.raises(Int8FormatError, match=rf"nf4\.safetensors: uint8 tensor '{k}' is named like a layer"):
        read_int8_file(_write_bad(tmp_path, packed_4bit, "nf4.safetensors"))
    native = {
        "w.weight": torch.zeros(8, 16, dtype=torch.int8),
        "w.weight_scale": torch.ones(8, 1),
        "w.comfy_quant": config_to_tensor(Int8WeightConfig()),
        "v.bias": torch.zeros(8, dtype=torch.uint8),
        "spiece_model": spiece_model,
    }
    with pytest.raises(Int8FormatError, match=r"native\.safetensors: uint8 tensor 'v\.bias' is named like"):
        read_int8_file(_write_bad(tmp_path, native, "native.safetensors"))
    for name, tensor in (
        ("tokens", torch.zeros(4, dtype=torch.int8)),
        (k, torch.zeros(4, dtype=torch.uint8)),
    ):
        bad = _write_bad(tmp_path, {**float_te, name: tensor}, "odd.safetensors")
        with pytest.raises(Int8FormatError, match=rf"odd\.safetensors: tensor '{name}' is [IU]8; only float"):
            quantize_file(bad, tmp_path / "out.safetensors", family="text_encoder")
    assert not (tmp_path / "out.safetensors").exists()


def test_one_part_of_a_full_checkpoint_is_detected_and_read_alone(tmp_path: Path) -> None:
    """An INT8 diffusion model next to a bf16 VAE (and a uint8 tensor no INT8 format allows) in one
    file: read with the diffusion model's keys, only those are detected, checked and returned."""
    source = _ltxv_like()
    plan = plan_quantization({k: tuple(v.shape) for k, v in source.items()}, "ltxv", Int8WeightConfig())
    dit = {f"model.diffusion_model.{k}": v for k, v in quantize_state_dict(source, plan).items()}
    others = {"vae.decoder.conv_in.weight": torch.zeros(8, 8, 3, 3), "vae.stray.weight": torch.zeros(4, 4)}
    others["vae.stray.weight"] = others["vae.stray.weight"].to(torch.uint8)
    path = tmp_path / "checkpoint.safetensors"
    save_file({**dit, **others}, str(path), {"config": "{}"})
    with pytest.raises(Int8FormatError, match=r"vae\.stray\.weight"):
        read_int8_file(path)  # the whole file: the VAE part is checked too
    loaded = read_int8_file(path, [key for key in read_header(path).dtypes if key.startswith("model.")])
    assert loaded.format == "comfy_native"
    assert set(loaded.tensors) == set(dit) and loaded.metadata == {"config": "{}"}


def test_odd_layouts_are_format_errors_not_crashes(tmp_path: Path) -> None:
    """Each of these used to escape as IndexError, TypeError or ZeroDivisionError (a traceback in the
    loader node), or to pass the header check and be refused by the loader only."""
    weight = torch.zeros(8, 16, dtype=torch.int8)
    quant = '{"layers": {"w": {"format": "int8_rowwise", "convrot": true, "convrot_groupsize": null}}}'
    files = {
        "scalar.safetensors": (
            {"w.weight": torch.zeros((), dtype=torch.int8), "w.weight_scale": torch.ones(1)},
            {},
        ),
        "null-group.safetensors": (
            {"w.weight": weight, "w.weight_scale": torch.ones(8, 1)},
            {"_quantization_metadata": quant},
        ),
        "flat-config.safetensors": (
            {"w.weight": weight, "w.weight_scale": torch.ones(8, 1), "w.comfy_quant": torch.ones(2, 3)},
            {},
        ),
        "no-blocks.safetensors": ({"w.weight": weight, "w.weight_scale": torch.ones(8, 0)}, {}),
        "fp8-scale.safetensors": (
            {"w.weight": torch.zeros(8, 16).to(torch.float8_e4m3fn), "w.weight_scale": torch.ones(8, 1)},
            {},
        ),
    }
    for name, (tensors, metadata) in files.items():
        path = tmp_path / name
        save_file(tensors, str(path), metadata)
        for read in (read_int8_file, check_int8_header):
            if name == "flat-config.safetensors" and read is check_int8_header:
                assert check_int8_header(path) == "comfy_native"  # a config's contents are read on load
                continue
            with pytest.raises(Int8FormatError, match=rf"{name}"):
                read(path)
