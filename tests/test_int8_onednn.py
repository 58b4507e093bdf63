"""The ``onednn`` kernel (W8A8 through oneDNN's int8 linear): its maths against the exact int32 reference,
where it may run, its packed weights, its trace under torch.compile, and the dispatcher dropping what a
losing kernel keeps. Its accuracy against the float matmul, with every weight layout, is tested with the
other kernels' in ``test_int8_dispatch``."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight
from leanvideo.int8.dispatch import KernelDispatcher, KernelImpl
from leanvideo.int8.linear import (
    linear_w8a8,
    linear_w8a16,
    quantize_activations,
    reference_int_mm,
    run_kernel,
    w8a8_rows,
)
from leanvideo.int8.onednn import OneDNNWeights, onednn_rows, onednn_unsupported, onednn_vnni_missing
from leanvideo.int8.quantize import Int8Weight

pytestmark = pytest.mark.unit
HAS_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def _weight(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.02, torch.randn(
        out_features, generator=generator
    )


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch here was built without oneDNN")
@pytest.mark.parametrize("shape", [(17, 64, 29), (96, 512, 384)], ids=lambda s: "x".join(map(str, s)))
def test_onednn_rows_compute_the_exact_int32_products_rescaled(shape: tuple[int, int, int]) -> None:
    """Weights within ±63 keep every pair of u8 × s8 products inside 16 bits, so this holds on any x86
    CPU, VNNI or not: the kernel's products are the exact int32 ones, rescaled as ``int_mm`` rescales."""
    rows, in_features, out_features = shape
    weight, bias = _weight(out_features, in_features)
    qdata = torch.randint(-63, 64, (out_features, in_features), dtype=torch.int8)
    scale = weight.abs().amax(dim=1) / 63
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1))
    expected = w8a8_rows(x, qdata.t(), scale.reshape(1, -1), bias, torch.float32, int_mm=reference_int_mm)
    packed = OneDNNWeights().packed(qdata)
    rows_q, row_scale = quantize_activations(x)
    got = onednn_rows(rows_q, row_scale, packed, scale, bias, torch.float32)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert onednn_rows(rows_q, row_scale, packed, scale, None, torch.bfloat16).dtype == torch.bfloat16


def test_it_runs_only_where_oneDNN_has_VNNI_or_AMX(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(4, 8)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr("leanvideo.int8.onednn.cpu_flags", lambda: {"avx2", "fma"})
    assert "this CPU has no VNNI or AMX" in (onednn_vnni_missing() or "")
    for flag in ("avx_vnni", "avx512_vnni", "amx_int8"):  # AVX-VNNI alone is enough, unlike for _int_mm
        monkeypatch.setattr("leanvideo.int8.onednn.cpu_flags", lambda flag=flag: {"avx2", flag})
        assert onednn_vnni_missing() is None
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below VNNI" in (onednn_vnni_missing() or "")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")
    assert onednn_vnni_missing() is None
    assert onednn_unsupported(torch.zeros(4, 8, device="meta")) == "oneDNN's int8 linear runs on a CPU only"
    if HAS_ONEDNN:
        assert onednn_unsupported(x) is None


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch here was built without oneDNN")
def test_a_weight_is_packed_once_again_after_an_in_place_change_and_let_go_with_it() -> None:
    weights = OneDNNWeights()
    qdata = torch.randint(-63, 64, (32, 64), dtype=torch.int8)
    first = weights.packed(qdata)
    assert weights.packed(qdata) is first and len(weights) == 1
    qdata.mul_(1)  # in place: the version counter moves, so the copy may be stale
    assert weights.packed(qdata) is not first and len(weights) == 1
    weights.forget(qdata)
    assert len(weights) == 0
    weights.packed(qdata)
    del qdata
    gc.collect()
    assert len(weights) == 0  # held weakly: the copy goes with its weight


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch here was built without oneDNN")
def test_an_inference_tensor_weight_as_comfyui_loads_it_is_packed_once() -> None:
    """ComfyUI loads weights under torch.inference_mode: such tensors have no version counter (reading
    it raises), and the kernel must still run on them, in inference mode and out of it."""
    with torch.inference_mode():
        weight, bias = _weight(64, 128)
        packed = quantize_weight(weight, Int8WeightConfig())
    assert packed.qdata.is_inference()
    weights = OneDNNWeights()
    x = torch.randn(8, 128)
    out = run_kernel("onednn", x, packed, bias, onednn=weights)
    with torch.inference_mode():
        again = run_kernel("onednn", x, packed, bias, onednn=weights)
    assert len(weights) == 1 and torch.equal(out, again)
    torch.testing.assert_close(out, linear_w8a8(x, packed, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("traced", ["int_mm", "w8a16"])
def test_traced_by_torch_compile_it_runs_its_stand_in_in_one_graph(traced: str) -> None:
    import torch._dynamo

    weight, bias = _weight(64, 128)
    packed = quantize_weight(weight, Int8WeightConfig())
    x = torch.randn(2, 12, 128, generator=torch.Generator().manual_seed(2))
    weights = OneDNNWeights(traced=traced)

    def layer(inputs: torch.Tensor) -> torch.Tensor:
        return run_kernel("onednn", inputs, packed, bias, onednn=weights)

    torch._dynamo.reset()
    out = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    stand_in = linear_w8a8 if traced == "int_mm" else linear_w8a16
    torch.testing.assert_close(out, stand_in(x, packed, bias))
    assert len(weights) == 0  # nothing packed while tracing
    with pytest.raises(ValueError, match="'int_mm' or 'w8a16'"):
        OneDNNWeights(traced="onednn")


def test_the_dispatcher_drops_what_the_kernels_that_lost_keep(tmp_path: Path) -> None:
    weight, bias = _weight(64, 128)
    packed = quantize_weight(weight, Int8WeightConfig())
    x = torch.randn(32, 128)
    forgotten: list[str] = []

    def kernel(name: str, slow: bool) -> KernelImpl:
        def run(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
            if slow:
                time.sleep(0.01)  # slower than the fast one on any machine, however loaded
            return linear_w8a16(x, packed, bias)

        return KernelImpl(run=run, unsupported=lambda x, p: None, forget=lambda p: forgotten.append(name))

    kernels = {
        "w8a16": kernel("w8a16", True),
        "int_mm": kernel("int_mm", False),
        "onednn": kernel("onednn", True),
    }
    dispatcher = KernelDispatcher(cache_path=tmp_path / "t.json", kernels=kernels)
    dispatcher.linear(x, packed, bias)
    [choice] = dispatcher.choices().values()
    assert choice.kernel == "int_mm"
    assert sorted(forgotten) == ["onednn", "w8a16"]
