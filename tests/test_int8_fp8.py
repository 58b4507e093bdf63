"""fp8 in, INT8 out (`leanvideo quantize`): float8_e4m3fn, float8_e5m2 and ComfyUI's scaled fp8 (a scale
per tensor or per output channel, scale_input, the scaled_fp8 marker) are dequantized exactly before
quantizing; the report's SQNR is against those dequantized weights; no scaled-fp8 key is left behind.
INT8 from fp8 follows the fp8 grid (exact where a row's values fit it, never worse than absmax scales)
and rotates a layer where that pays. The loaders, against stock ComfyUI running the same fp8 file:
tests/test_int8_comfy.py and tests/test_int8_e2e.py."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path
from types import MappingProxyType

import pytest
import torch
from leanvideo.int8 import dequantize
from leanvideo.int8.convert import FP8_GRID_SCALES, quantize_file, quantize_state_dict
from leanvideo.int8.files import read_header
from leanvideo.int8.formats import read_int8_file
from leanvideo.int8.formats.common import config_from_tensor
from leanvideo.int8.fp8 import (
    ROTATION_MIN_GAIN_DB,
    dequantize_fp8,
    fp8_grid,
    is_fp8_companion,
    quantize_fp8_weight,
    to_fp8,
)
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.quantize import dequantize_weight, quantize_weight, sqnr_db, weight_sqnr_db
from leanvideo.int8.spec import FORMAT_VERSION, METADATA_KEY, Int8FormatError, Int8WeightConfig
from rich.console import Console
from safetensors.torch import save_file

from runner.cli.quantize import add_quantize_parser, run_quantize
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
    # fp8 weights the LTXV rules keep in float are written exactly: bfloat16 (every fp8 value is one),
    # float32 when scaled (fp8 × scale is exact there only)
    kept = loaded.tensors[PREFIX + "patchify_proj.weight"]
    assert kept.dtype == (torch.float32 if kind.startswith("scaled") else torch.bfloat16)
    assert torch.equal(kept.float(), exact["patchify_proj.weight"])
    assert loaded.tensors[PREFIX + "transformer_blocks.0.attn1.q_norm.weight"].dtype == torch.bfloat16


def test_a_scale_of_the_wrong_shape_is_named() -> None:
    weight = torch.zeros(4, 8).to(torch.float8_e4m3fn)
    with pytest.raises(Int8FormatError, match=r"blocks.0.q.weight: scale_weight has shape \(3,\)"):
        dequantize_fp8(weight, torch.ones(3), where="blocks.0.q.weight")
    assert torch.equal(dequantize_fp8(weight, torch.ones(4, 1), where="w"), torch.zeros(4, 8))


def test_a_negative_or_zero_scale_over_values_is_refused_by_name() -> None:
    """Stock ComfyUI would run such a layer as zeros or sign-flipped; the INT8 loader refuses its own
    scales that are not positive, and does the same for an fp8 file's."""
    weight = torch.tensor([[1.0, -2.0], [0.0, 0.0], [0.5, 0.25]]).to(torch.float8_e4m3fn)
    rows = torch.tensor([[0.5], [0.0], [2.0]])  # a zero scale over an all-zero row: consistent
    assert torch.equal(dequantize_fp8(weight, rows, where="w"), weight.float() * rows)
    for scale, said in (
        (torch.tensor(0.0), "1 value(s) that are negative or zero (the smallest is 0)"),
        (torch.tensor([[0.5], [0.0], [-2.0]]), "2 value(s) that are negative or zero (the smallest is -2)"),
        (torch.tensor([[0.0], [1.0], [1.0]]), "1 value(s) that are negative or zero (the smallest is 0)"),
    ):
        with pytest.raises(Int8FormatError, match=rf"^blocks.0.q.weight: scale_weight has {re.escape(said)}"):
            dequantize_fp8(weight, scale, where="blocks.0.q.weight")


def test_other_dtypes_are_still_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "ints.safetensors"
    save_file({"transformer_blocks.0.attn1.to_q.weight": torch.zeros(4, 4, dtype=torch.int16)}, str(path))
    with pytest.raises(Int8FormatError, match=r"'transformer_blocks.0.attn1.to_q.weight' is I16; only float"):
        quantize_file(path, tmp_path / "out.safetensors", family="ltxv")


def _outlier_columns(rows: int, columns: int, seed: int) -> torch.Tensor:
    """N(0, 0.02²) with every 50th input column 20× larger: the rows of an outlier-heavy layer."""
    weight = torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed)) * 0.02
    weight[:, ::50] *= 20
    return weight


def test_plain_e4m3_rows_of_real_weight_magnitudes_stay_exact() -> None:
    """Rows whose largest value is below 0.25 (DiT weights: std ≈ 0.02) hold multiples of e4m3's
    smallest step 2⁻⁹, which the fp8-aligned int8 step divides: INT8 carries them exactly."""
    fp8 = (torch.randn(256, 512, generator=torch.Generator().manual_seed(1)) * 0.02).to(torch.float8_e4m3fn)
    weight = dequantize_fp8(fp8, None, where="w")
    on_grid = dequantize_weight(quantize_weight(weight, Int8WeightConfig(), fp8_grid=fp8_grid(None)))
    absmax = dequantize_weight(quantize_weight(weight, Int8WeightConfig()))
    print(f"e4m3 std 0.02: absmax scales {sqnr_db(weight, absmax):.1f} dB against the fp8 weights")
    assert torch.equal(on_grid, weight)
    assert sqnr_db(weight, absmax) < 50.0  # absmax scales are off the grid and round


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale", ["none", "tensor", "channel"])
def test_values_of_the_top_binades_are_exact_whatever_the_scale(dtype: torch.dtype, scale: str) -> None:
    """fp8 values within 4 binades of their row's (or block's) largest, times any scale_weight."""
    generator = torch.Generator().manual_seed(2)
    magnitude = torch.rand(64, 128, generator=generator) * 14 + 1  # [1, 15]: binades 0 to 3
    magnitude[:, ::32] = 15.0  # every block of 32 reaches binade 3
    sign = torch.randint(0, 2, (64, 128), generator=generator) * 2 - 1
    fp8 = (sign * magnitude).to(dtype)
    scales = {
        "none": None,
        "tensor": torch.tensor(0.37),
        "channel": torch.rand(64, generator=generator) + 0.1,
    }
    weight = dequantize_fp8(fp8, scales[scale], where="x.weight")
    for config in (Int8WeightConfig(), Int8WeightConfig(granularity="block", block_size=32)):
        packed = quantize_weight(weight, config, fp8_grid=fp8_grid(scales[scale]))
        assert torch.equal(dequantize_weight(packed), weight)


@pytest.mark.parametrize("kind", ["e4m3", "e5m2", "scaled", "scaled_channel"])
@pytest.mark.parametrize("granularity", ["row", "block"])
def test_fp8_grid_scales_never_lose_to_absmax(kind: str, granularity: str) -> None:
    """Per row (or block) the scale with the smaller error against the fp8 weights is kept; on
    gaussian and heavy-tailed rows alike the result beats absmax scales against the bf16 original."""
    generator = torch.Generator().manual_seed(3)
    heavy = torch.randn(128, 256, generator=generator) / torch.rand(128, 256, generator=generator).add(0.05)
    original = {"g.weight": torch.randn(128, 256, generator=generator) * 0.3, "h.weight": heavy * 0.01}
    stored, exact = to_fp8({k: v.to(torch.bfloat16).float() for k, v in original.items()}, kind)
    config = (
        Int8WeightConfig(granularity="block", block_size=64) if granularity == "block" else Int8WeightConfig()
    )
    for key, bf16 in original.items():
        weight, grid = exact[key], fp8_grid(stored.get(key.replace(".weight", ".scale_weight")))
        on_grid = dequantize_weight(quantize_weight(weight, config, fp8_grid=grid))
        absmax = dequantize_weight(quantize_weight(weight, config))
        group = 64 if granularity == "block" else 256
        errors = [(restored - weight).pow(2).reshape(128, -1, group).sum(2) for restored in (on_grid, absmax)]
        assert (errors[0] <= errors[1]).all()
        gain = sqnr_db(bf16, on_grid) - sqnr_db(bf16, absmax)
        print(f"{kind} {granularity} {key}: fp8 {sqnr_db(bf16, weight):.2f} dB, INT8 of it +{gain:.3f} dB")
        assert gain > 0


def test_an_outlier_heavy_fp8_layer_is_rotated_and_a_plain_one_is_not() -> None:
    cases = {"outliers": _outlier_columns(256, 512, 4), "plain": torch.randn(256, 512) * 0.02}
    for label, original in cases.items():
        stored, exact = to_fp8({"x.weight": original}, "scaled")
        weight, grid = exact["x.weight"], fp8_grid(stored["x.scale_weight"])
        packed = quantize_fp8_weight(weight, grid, Int8WeightConfig(), name="x")
        unrotated = quantize_weight(weight, Int8WeightConfig(), fp8_grid=grid)
        before, after = weight_sqnr_db(weight, unrotated), weight_sqnr_db(weight, packed)
        print(f"{label}: {before:.1f} dB unrotated, {after:.1f} dB as quantized")
        assert packed.config.convrot is (label == "outliers")
        if label == "outliers":
            assert after - before >= ROTATION_MIN_GAIN_DB
        else:
            assert torch.equal(packed.qdata, unrotated.qdata) and torch.equal(packed.scale, unrotated.scale)
    asked = quantize_fp8_weight(weight, grid, Int8WeightConfig(convrot=True), name="x")
    assert asked.config.convrot  # an asked-for rotation stays


def test_quantize_file_and_quantize_on_load_agree_on_fp8_and_record_the_rule(tmp_path: Path) -> None:
    tensors = _ltxv_like()
    tensors["transformer_blocks.0.ff.net.2.weight"] = _outlier_columns(64, 256, 5).to(torch.bfloat16)
    stored, _ = to_fp8(tensors, "scaled", PREFIX)
    source, target = tmp_path / "dit-scaled.safetensors", tmp_path / "dit-int8.safetensors"
    save_file(stored, str(source), {"config": '{"transformer": {}}'})
    report = quantize_file(source, target, family="ltxv")
    assert report.rotated_layers == [PREFIX + "transformer_blocks.0.ff.net.2"]
    entry = json.loads(read_header(target).metadata[METADATA_KEY])
    assert entry == {"format_version": FORMAT_VERSION, "scales": FP8_GRID_SCALES}
    written = read_int8_file(target).tensors
    shapes = {key.removeprefix(PREFIX): tuple(t.shape) for key, t in stored.items()}
    plan = {PREFIX + layer: c for layer, c in plan_quantization(shapes, "ltxv", Int8WeightConfig()).items()}
    on_load = quantize_state_dict(stored, plan)
    assert set(on_load) == set(written)
    for key, tensor in on_load.items():
        assert torch.equal(tensor, written[key]), key


def _refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def test_the_cli_reports_exact_layers_in_strict_json(tmp_path: Path) -> None:
    """Plain e4m3 weights of real magnitude come out exact: infinite SQNR, written as null."""
    source, target = tmp_path / "dit-e4m3.safetensors", tmp_path / "dit-int8.safetensors"
    fp8_file(source, "e4m3")
    parser = argparse.ArgumentParser(prog="leanvideo")
    add_quantize_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    args = parser.parse_args(["quantize", str(source), str(target), "--json"])
    assert run_quantize(args, Console(file=out, width=200)) == 0, out.getvalue()
    report = json.loads(out.getvalue(), parse_constant=_refuse)
    assert report["exact_layers"] == report["layers"] == len(QUANTIZED_LAYERS)
    assert report["sqnr_db"]["min"] is None and report["fp8_tensors"] > 0
    assert report["fp8_rotated_layers"] == []


@pytest.mark.parametrize("kind", ["scaled", "none"])
def test_a_loader_s_tensors_are_consumed_as_they_convert_with_the_same_result(kind: str) -> None:
    """Quantize on load hands its own dict over (``consume``): each source tensor leaves it as its
    result is made, so the source's memory goes while the INT8 model grows; the result is the same."""
    tensors = _ltxv_like() if kind == "none" else to_fp8(_ltxv_like(), kind)[0]
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if not is_fp8_companion(k)}
    plan = plan_quantization(shapes, "ltxv", Int8WeightConfig())
    kept = quantize_state_dict(tensors, plan)
    source = dict(tensors)
    seen: list[int] = []

    class Watched(dict):  # the dict's size each time a tensor leaves it
        def pop(self, key: str, *default: object) -> torch.Tensor:
            seen.append(len(self))
            return super().pop(key, *default)

    watched = Watched(source)
    consumed = quantize_state_dict(watched, plan, consume=True)
    assert not watched and seen == sorted(seen, reverse=True) and len(seen) == len(shapes)
    assert consumed.keys() == kept.keys()
    assert all(torch.equal(consumed[k], kept[k]) for k in kept)
    with pytest.raises(TypeError, match="mutable mapping"):
        quantize_state_dict(MappingProxyType(tensors), plan, consume=True)
