"""The ``int_mm_fused`` INT8 kernel: ``int_mm``'s maths compiled by torch.compile as one graph. It must
compute what ``int_mm`` computes, compile once per process (not once per model load), trace into a
compiled model as one graph, and be ruled out, not crash a load, where compiling fails (a machine
without a C++ compiler)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight, sqnr_db
from leanvideo.int8.dispatch import KernelDispatcher, LazyKitchen, default_kernels
from leanvideo.int8.linear import FusedW8A8, rescale_output, run_kernel, w8a8_rows

CONFIGS = {
    "row": Int8WeightConfig(),
    "tensor": Int8WeightConfig(granularity="tensor"),
    "row-convrot": Int8WeightConfig(convrot=True),
}


def _layer(rows: int, in_features: int, out_features: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.02
    x = torch.randn(rows, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) * 0.1
    return weight, x, bias


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_the_fused_kernel_computes_what_int_mm_computes(
    config_name: str, dtype: torch.dtype, with_bias: bool
) -> None:
    weight, x, bias = _layer(72, 512, 384)
    packed = quantize_weight(weight, CONFIGS[config_name])
    inputs = x.to(dtype).reshape(2, 36, 512)  # a batch of token rows, as a DiT passes them
    fused = run_kernel("int_mm_fused", inputs, packed, bias if with_bias else None, fused=FusedW8A8())
    eager = run_kernel("int_mm", inputs, packed, bias if with_bias else None)
    agreement = sqnr_db(eager.float(), fused.float())
    print(f"int_mm_fused vs int_mm, {config_name} {dtype} bias={with_bias}: {agreement:.1f} dB")
    assert fused.shape == eager.shape == (2, 36, 384) and fused.dtype == dtype
    assert agreement >= 60.0  # the same maths; at most a last-bit rounding apart


def test_the_compiled_graph_is_the_eager_maths() -> None:
    """Quantize, int8 matmul and rescale, compiled, against the same eager ops and against the exact
    rescale in float64."""
    generator = torch.Generator().manual_seed(4)
    rows = torch.randn(24, 96, generator=generator)
    weight_t = torch.randint(-127, 128, (40, 96), generator=generator, dtype=torch.int8).t()
    weight_scale = torch.rand(1, 40, generator=generator) * 0.01
    bias = torch.randn(40, generator=generator).to(torch.bfloat16)
    for out_bias in (bias, None):
        for dtype in (torch.float32, torch.bfloat16):
            inputs = rows.to(dtype)  # as a layer passes them: its output in its input's dtype
            compiled = FusedW8A8()(inputs, weight_t, weight_scale, out_bias, dtype)
            torch.testing.assert_close(compiled, w8a8_rows(inputs, weight_t, weight_scale, out_bias, dtype))
    accumulated = torch.randint(-(2**20), 2**20, (24, 40), generator=generator, dtype=torch.int32)
    x_scale = torch.rand(24, 1, generator=generator) * 0.01
    exact = accumulated.double() * x_scale.double() * weight_scale.double() + bias.double()
    out = rescale_output(accumulated, x_scale, weight_scale, bias, torch.float32)
    torch.testing.assert_close(out, exact.float())


def test_a_compile_mode_with_cuda_graphs_or_unknown_is_refused_naming_the_modes() -> None:
    for mode in ("reduce-overhead", "max-autotune", "fast"):
        with pytest.raises(ValueError, match=f"not '{mode}'") as refused:
            FusedW8A8(mode)
        assert "max-autotune-no-cudagraphs" in str(refused.value)


def test_a_second_model_load_compiles_nothing_again() -> None:
    """Every model load makes its own dispatcher and so its own :class:`FusedW8A8`: the compiled code
    is torch's per function, so only the first compiles, whatever the rows (shapes are dynamic)."""
    from torch._dynamo.utils import counters

    weight, x, bias = _layer(48, 256, 128)
    packed = quantize_weight(weight, Int8WeightConfig())
    run_kernel("int_mm_fused", x, packed, bias, fused=FusedW8A8())
    graphs = counters["stats"]["unique_graphs"]
    for rows in (48, 40, 300):
        run_kernel("int_mm_fused", torch.randn(rows, 256), packed, bias, fused=FusedW8A8())
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_fused_layer_compiles_into_one_graph_and_matches_eager() -> None:
    """Inside a model compiled whole (ComfyUI's TorchCompileModel) the plain maths is traced in."""
    weight, x, bias = _layer(48, 512, 256)
    packed = quantize_weight(weight, Int8WeightConfig(convrot=True))
    fused = FusedW8A8()

    def layer(inputs: torch.Tensor) -> torch.Tensor:
        return run_kernel("int_mm_fused", inputs, packed, bias, fused=fused)

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    assert out.shape == (48, 256)
    assert fused._compiled is None  # traced as plain maths: no nested torch.compile was set up
    assert sqnr_db(layer(x).float(), out.float()) >= 60.0


def test_where_compiling_fails_the_dispatcher_rules_the_fused_kernel_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No working C++ compiler (a Windows machine without one, say): compiling raises, the dispatcher
    keeps the reason and runs a kernel that works. (auto measures the fused kernel on a GPU; here it is
    told to on the CPU.)"""
    import torch._dynamo
    import torch._inductor.config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # nothing compiled before
    no_compiler = {"fx_graph_cache": False, "cpp.cxx": (str(tmp_path / "no-such-compiler"),)}
    weight, x, bias = _layer(64, 256, 128)
    packed = quantize_weight(weight, Int8WeightConfig())
    kernels = default_kernels(LazyKitchen(lambda: None))
    kernels["int_mm_fused"] = dataclasses.replace(kernels["int_mm_fused"], cpu_skip=lambda: None)
    dispatcher = KernelDispatcher(kernels=kernels)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(no_compiler):
            out = dispatcher.linear(x, packed, bias)
    finally:
        torch._dynamo.reset()  # drop the failed compilation before the next test compiles
    [choice] = dispatcher.choices().values()
    assert choice.kernel in ("w8a16", "int_mm")
    assert choice.rejected["int_mm_fused"].startswith("error:"), choice.rejected
    assert "compiler" in choice.rejected["int_mm_fused"].lower()
    assert sqnr_db(torch.nn.functional.linear(x, weight, bias), out) >= 35.0


def test_the_fused_kernel_asks_for_its_compiled_function_by_name() -> None:
    weight, x, _ = _layer(32, 128, 64)
    packed = quantize_weight(weight, Int8WeightConfig())
    with pytest.raises(ValueError, match=r"int_mm_fused.*fused=FusedW8A8"):
        run_kernel("int_mm_fused", x, packed)


def test_auto_leaves_the_fused_kernel_out_on_a_cpu_and_forcing_runs_it() -> None:
    """On a CPU the fused kernel gains a few % per layer, and compiling it would cost every server
    seconds at its first prompt: auto does not measure it there (and says so); ``path`` forces it."""
    weight, x, bias = _layer(64, 256, 128)
    packed = quantize_weight(weight, Int8WeightConfig())
    measured = KernelDispatcher(kernels=default_kernels(LazyKitchen(lambda: None)))
    measured.linear(x, packed, bias)
    [choice] = measured.choices().values()
    assert "int_mm_fused" not in choice.seconds
    assert choice.rejected["int_mm_fused"].startswith("not measured on a CPU")
    assert "path=int_mm_fused forces it" in choice.rejected["int_mm_fused"]
    forced = KernelDispatcher(forced="int_mm_fused", kernels=default_kernels(LazyKitchen(lambda: None)))
    out = forced.linear(x, packed, bias)
    [choice] = forced.choices().values()
    assert (choice.kernel, choice.source) == ("int_mm_fused", "forced")
    assert torch.equal(out, run_kernel("int_mm", x, packed, bias))
