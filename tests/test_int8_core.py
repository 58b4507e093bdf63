"""INT8 core: quantize/dequantize accuracy (SQNR thresholds, measured values printed), Hadamard
rotation, and the W8A16/W8A8 linear paths (W8A8 through the CPU reference integer matmul)."""

from __future__ import annotations

import pytest
import torch
from leanvideo.int8 import (
    Int8WeightConfig,
    dequantize_weight,
    expected_scale_shape,
    hadamard_matrix,
    int8_linear,
    linear_w8a8,
    linear_w8a16,
    quantize_weight,
    reference_int_mm,
    rotate_groups,
    sqnr_db,
    w8a8_fits,
    weight_sqnr_db,
)
from leanvideo.int8.quantize import scaled
from leanvideo.int8.spec import Int8FormatError


def _weight(out_features: int = 256, in_features: int = 512, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.02


@pytest.mark.parametrize(
    ("config", "threshold_db"),
    [
        (Int8WeightConfig(granularity="row"), 40.0),
        (Int8WeightConfig(granularity="tensor"), 36.0),
        (Int8WeightConfig(granularity="block", block_size=64), 41.0),
        (Int8WeightConfig(granularity="row", convrot=True, convrot_group=256), 40.0),
    ],
    ids=["row", "tensor", "block64", "row-convrot"],
)
def test_weight_sqnr_meets_threshold(config: Int8WeightConfig, threshold_db: float) -> None:
    weight = _weight()
    packed = quantize_weight(weight, config)
    measured = sqnr_db(weight, dequantize_weight(packed))
    print(f"SQNR {config.to_json()}: {measured:.2f} dB (threshold {threshold_db} dB)")
    assert packed.qdata.dtype == torch.int8
    assert packed.scale.dtype == torch.float32
    assert tuple(packed.scale.shape) == expected_scale_shape(tuple(weight.shape), config)
    assert int(packed.qdata.abs().max()) <= 127
    assert measured >= threshold_db


def test_convrot_helps_an_outlier_heavy_layer() -> None:
    weight = _weight()
    weight[:, 7] *= 40.0  # one outlier input channel, as in attention projections
    plain = sqnr_db(weight, dequantize_weight(quantize_weight(weight, Int8WeightConfig())))
    rotated = sqnr_db(weight, dequantize_weight(quantize_weight(weight, Int8WeightConfig(convrot=True))))
    print(f"outlier layer SQNR: row {plain:.2f} dB, row+convrot {rotated:.2f} dB")
    assert rotated > plain + 3.0


@pytest.mark.parametrize(("kind", "size"), [("regular", 64), ("regular", 256), ("sylvester", 128)])
def test_hadamard_is_orthogonal_symmetric_and_its_own_inverse(kind: str, size: int) -> None:
    matrix = hadamard_matrix(size, kind=kind, dtype=torch.float64)
    assert torch.allclose(matrix @ matrix.T, torch.eye(size, dtype=torch.float64))
    assert torch.equal(matrix, matrix.T) and torch.allclose(matrix.abs(), torch.full_like(matrix, size**-0.5))
    x = torch.randn(3, 4 * size, dtype=torch.float64)
    assert torch.allclose(rotate_groups(rotate_groups(x, size, kind), size, kind), x)


def test_the_two_hadamard_kinds_differ_and_sizes_are_checked() -> None:
    regular, sylvester = (hadamard_matrix(16, kind=k, dtype=torch.float64) for k in ("regular", "sylvester"))
    assert not torch.allclose(regular, sylvester)  # a file read with the wrong one is garbage
    with pytest.raises(ValueError, match="power of 4"):
        hadamard_matrix(128)  # ConvRot's regular matrix exists for 4, 16, 64, 256, …
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(48, kind="sylvester")
    with pytest.raises(ValueError, match="power of 4"):
        Int8WeightConfig(convrot=True, convrot_group=128)
    assert Int8WeightConfig(convrot=True, convrot_group=128, hadamard="sylvester").convrot_group == 128


def test_regular_hadamard_is_comfy_kitchens_convrot_matrix() -> None:
    """ConvRot as ComfyUI's kernel library defines it: the same matrix, so a ``convrot`` layer means
    the same thing in our files and in theirs."""
    kitchen = pytest.importorskip("comfy_kitchen.tensor.int8_utils", reason="comfy-kitchen not installed")
    for size in (16, 64, 256):
        theirs = kitchen._build_hadamard(size, device="cpu", dtype=torch.float64)
        assert torch.allclose(hadamard_matrix(size, dtype=torch.float64), theirs)


def test_config_validation_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="block_size"):
        Int8WeightConfig(granularity="block")
    with pytest.raises(ValueError, match="'column'"):
        Int8WeightConfig(granularity="column")  # type: ignore[arg-type]
    with pytest.raises(Int8FormatError, match=r"blocks\.0\.w"):
        quantize_weight(
            _weight(8, 100), Int8WeightConfig(granularity="block", block_size=64), name="blocks.0.w"
        )
    config = Int8WeightConfig(granularity="row", convrot=True)
    assert Int8WeightConfig.from_dict(config.to_dict(), where="x") == config


def test_all_zero_rows_stay_finite() -> None:
    weight = _weight(4, 256)
    weight[1] = 0
    restored = dequantize_weight(quantize_weight(weight, Int8WeightConfig()))
    assert torch.isfinite(restored).all()
    assert torch.equal(restored[1], torch.zeros(256))


@pytest.mark.parametrize("convrot", [False, True], ids=["plain", "convrot"])
def test_w8a8_reference_matches_w8a16(convrot: bool) -> None:
    weight = _weight(128, 256)
    packed = quantize_weight(weight, Int8WeightConfig(convrot=convrot))
    x = torch.randn(2, 33, 256, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(128) * 0.1
    reference = torch.nn.functional.linear(x, weight, bias)
    w8a16 = linear_w8a16(x, packed, bias)
    w8a8 = linear_w8a8(x, packed, bias, int_mm=reference_int_mm)
    w8a16_db, w8a8_db = sqnr_db(reference, w8a16), sqnr_db(reference, w8a8)
    print(f"linear SQNR vs float (convrot={convrot}): W8A16 {w8a16_db:.2f} dB, W8A8 {w8a8_db:.2f} dB")
    assert w8a8.shape == (2, 33, 128)
    assert w8a16_db >= 38.0
    assert w8a8_db >= 33.0
    assert sqnr_db(w8a16, w8a8) >= 33.0


def test_reference_int_mm_is_exact() -> None:
    a = torch.randint(-127, 128, (17, 64), dtype=torch.int8)
    b = torch.randint(-127, 128, (64, 24), dtype=torch.int8)
    expected = (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)
    assert torch.equal(reference_int_mm(a, b), expected)


def test_int8_linear_runs_the_named_kernel() -> None:
    weight = _weight(64, 256)
    packed = quantize_weight(weight, Int8WeightConfig())
    x = torch.randn(32, 256, dtype=torch.bfloat16)
    assert w8a8_fits(x, packed)  # torch._int_mm takes any shape on a CPU
    assert torch.equal(
        int8_linear(x, packed, route="auto"), linear_w8a16(x, packed)
    )  # auto needs a dispatcher
    for route in ("int_mm", "w8a8"):  # w8a8 is int_mm's older name
        out = int8_linear(x, packed, route=route)  # type: ignore[arg-type]
        assert out.dtype == torch.bfloat16
        assert torch.equal(out, linear_w8a8(x, packed))
    with pytest.raises(ValueError, match="'fast'"):
        int8_linear(x, packed, route="fast")  # type: ignore[arg-type]


@pytest.mark.gpu
def test_w8a8_cuda_kernel_matches_reference() -> None:
    packed = quantize_weight(_weight(128, 256).cuda(), Int8WeightConfig())
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    assert w8a8_fits(x, packed)
    fast = linear_w8a8(x, packed)
    slow = linear_w8a8(x, packed, int_mm=reference_int_mm)
    assert torch.allclose(fast.float(), slow.float(), atol=1e-2)


def _state_dict() -> tuple[dict[str, torch.Tensor], dict[str, Int8WeightConfig]]:
    from leanvideo.int8.fp8 import to_fp8

    float_part = {"a.weight": _weight(96, 256).to(torch.bfloat16), "a.bias": torch.randn(96)}
    fp8_part, _ = to_fp8({"b.weight": _weight(64, 256), "c.weight": _weight(32, 256)}, "scaled_channel")
    plan = {"a": Int8WeightConfig(), "b": Int8WeightConfig(), "c": Int8WeightConfig(convrot=True)}
    return {**float_part, **fp8_part}, plan


def test_quantizing_on_a_device_returns_the_results_where_the_weights_were() -> None:
    from leanvideo.int8.convert import quantize_state_dict

    tensors, plan = _state_dict()
    here = quantize_state_dict(tensors, plan)
    there = quantize_state_dict(dict(tensors), plan, device=torch.device("cpu"))
    assert here.keys() == there.keys() and "b.scale_weight" not in here
    for key, value in here.items():
        assert there[key].device == value.device and torch.equal(there[key], value), key


def test_a_gpu_that_fills_up_while_quantizing_leaves_the_weight_to_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from leanvideo.int8 import convert

    tensors, plan = _state_dict()
    here = convert.quantize_state_dict(tensors, plan)
    real = convert._quantize_layer
    failed: list[str] = []

    def first_fails(key: str, *args: object, **kwargs: object) -> object:
        if key not in failed:  # on the "GPU": out of memory
            failed.append(key)
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(convert, "_quantize_layer", first_fails)
    there = convert.quantize_state_dict(dict(tensors), plan, device=torch.device("cpu"))
    assert sorted(failed) == ["a.weight", "b.weight", "c.weight"]
    assert all(torch.equal(there[key], value) for key, value in here.items())


@pytest.mark.gpu
def test_quantizing_on_load_on_the_gpu_gives_the_cpu_values() -> None:
    from leanvideo.int8.convert import quantize_state_dict

    tensors, plan = _state_dict()
    here = quantize_state_dict(tensors, plan)
    there = quantize_state_dict(dict(tensors), plan, device=torch.device("cuda"))
    for key, value in here.items():
        assert there[key].device.type == "cpu", key
        if key.startswith("a."):  # a float weight: absmax, a division and rounding, exact anywhere
            assert torch.equal(there[key], value), key
        elif value.dtype == torch.int8:  # rotated (a float32 matrix product), or an fp8 grid choice (a
            # sum of errors, a near tie may go the other way): a few values one step apart
            differ = there[key].int() - value.int()
            assert differ.abs().max() <= 2 and (differ != 0).float().mean() < 0.1, key
        else:
            assert torch.allclose(there[key].float(), value.float(), rtol=0.02, atol=0), key


@pytest.mark.parametrize(
    "config",
    [
        Int8WeightConfig(granularity="row"),
        Int8WeightConfig(granularity="tensor", convrot=True),
        Int8WeightConfig(granularity="block", block_size=128),
    ],
    ids=["row", "tensor-convrot", "block128"],
)
def test_chunked_quantization_matches_one_pass(
    config: Int8WeightConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    weight = _weight(96, 512).to(torch.bfloat16)
    whole = quantize_weight(weight, config)
    monkeypatch.setattr("leanvideo.int8.quantize._CHUNK_ELEMENTS", 5000)  # 9 rows per chunk
    chunked = quantize_weight(weight, config)
    assert torch.equal(whole.qdata, chunked.qdata)
    assert torch.equal(whole.scale, chunked.scale)
    assert weight_sqnr_db(weight, chunked) == pytest.approx(
        sqnr_db(weight, dequantize_weight(whole)), abs=1e-6
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_weight_with_nan_or_inf_is_refused_naming_it(value: float) -> None:
    weight = torch.randn(64, 32)
    weight[5, 7] = value
    said = r"blocks\.0\.w\.weight: 1 of 2048 values are NaN or infinite"
    for granularity in ("row", "tensor"):
        with pytest.raises(Int8FormatError, match=said):
            quantize_weight(weight, Int8WeightConfig(granularity=granularity), name="blocks.0.w.weight")


def test_quantize_on_load_refuses_nan_in_kept_tensors_too() -> None:
    from leanvideo.int8.convert import quantize_state_dict

    tensors = {
        "blocks.0.w.weight": torch.randn(64, 32),
        "blocks.0.norm.bias": torch.tensor([1.0, float("inf")]),
    }
    said = r"tensor 'blocks\.0\.norm\.bias': 1 of 2 values are NaN or infinite"
    with pytest.raises(Int8FormatError, match=said):
        quantize_state_dict(tensors, {"blocks.0.w": Int8WeightConfig(granularity="row")})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "config",
    [
        Int8WeightConfig(),
        Int8WeightConfig(granularity="tensor"),
        Int8WeightConfig(granularity="block", block_size=64),
    ],
    ids=["row", "tensor", "block"],
)
def test_dequantizing_in_one_pass_is_bit_for_bit_the_float32_product_rounded_once(
    config: Int8WeightConfig, dtype: torch.dtype
) -> None:
    """The weight is dequantized in one pass (int8 read, ``dtype`` written): exactly what converting to
    float32, multiplying by the scale there and converting to ``dtype`` gives."""
    packed = quantize_weight(_weight(96, 256), config)
    scale = packed.scale.to(torch.float32)
    if config.granularity == "block":
        scale = scale.repeat_interleave(256 // scale.shape[1], dim=1)
    reference = (packed.qdata.to(torch.float32) * scale).to(dtype)
    got = dequantize_weight(packed, dtype)
    assert got.dtype == dtype and torch.equal(got, reference)
    # the one-pass way a GPU takes (a mixed-dtype multiplication into a `dtype` output) gives the same
    one_pass = scaled(packed.qdata, packed.scale.to(torch.float32), dtype, one_pass=True)
    assert one_pass.dtype == dtype and torch.equal(one_pass, reference)
