"""INT8 on a CPU where ``torch._int_mm`` has no fast path: torch runs oneDNN's int8 GEMM only on a CPU
with AVX-512 VNNI and oneDNN on, and a scalar loop elsewhere (AVX2-only and AVX-VNNI-only CPUs). There
``auto`` does not spend seconds per shape measuring W8A8 kernels that lose; forcing one still runs it.

Switching oneDNN off (``torch.backends.mkldnn.enabled``) takes torch down the very code path an
AVX2-only CPU takes, so these tests run it for real on any machine."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight
from leanvideo.int8.device import cpu_isa
from leanvideo.int8.dispatch import KernelDispatcher, LazyKitchen, RunKernel, default_kernels
from leanvideo.int8.kernel_table import current_fingerprint, load_table
from leanvideo.int8.linear import KERNELS, int_mm_cpu_fallback, run_kernel
from leanvideo.int8.onednn import onednn_vnni_missing
from leanvideo.int8.quantize import Int8Weight


@pytest.fixture
def onednn_off() -> Iterator[None]:
    before = torch.backends.mkldnn.enabled
    torch._C._set_mkldnn_enabled(False)  # what torch.backends.mkldnn.flags() sets, without its warning
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def _counted(name: str, run: RunKernel, calls: list[str]) -> RunKernel:
    def counted(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        calls.append(name)
        return run(x, packed, bias)

    return counted


def _layer() -> tuple[torch.Tensor, Int8Weight, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(128, 256, generator=generator) * 0.02
    x = torch.randn(48, 256, generator=generator)
    return x, quantize_weight(weight, Int8WeightConfig()), torch.randn(128, generator=generator) * 0.1


def test_with_onednn_off_auto_measures_no_int_mm_kernel_says_why(onednn_off: None, tmp_path: Path) -> None:
    reason = int_mm_cpu_fallback()
    assert reason is not None and "scalar loop" in reason and "switched off" in reason
    x, packed, bias = _layer()
    calls: list[str] = []
    kernels = default_kernels(LazyKitchen(lambda: pytest.fail("comfy-kitchen imported though skipped")))
    for name, impl in kernels.items():
        kernels[name] = dataclasses.replace(impl, run=_counted(name, impl.run, calls))
    dispatcher = KernelDispatcher(cache_path=tmp_path / "int8_kernels.json", kernels=kernels)
    out = dispatcher.linear(x, packed, bias)
    [choice] = dispatcher.choices().values()
    # oneDNN's int8 linear does not ask torch.backends.mkldnn (an AVX-VNNI-only CPU's one W8A8 kernel)
    onednn = {"onednn"} if onednn_vnni_missing() is None else set()
    assert choice.kernel in {"w8a16", *onednn} and choice.source == "measured"
    assert set(calls) == {"w8a16", *onednn} and set(choice.seconds) == {"w8a16", *onednn}
    int_mm_kernels = [k for k in KERNELS[1:] if k != "onednn"]  # the kernels that end in torch._int_mm
    for name in int_mm_kernels:
        assert choice.rejected[name].startswith(f"not measured on a CPU ({reason}")
        assert f"path={name} forces it" in choice.rejected[name]
    # the report says the reason once for the kernels it rules out together
    report = dispatcher.summary()
    assert report.count(reason) == 1 and f"{', '.join(int_mm_kernels)}: not measured on a CPU" in report
    assert "path=KERNEL forces it" in report
    if choice.kernel == "w8a16":
        assert torch.equal(out, run_kernel("w8a16", x, packed, bias))
    [key] = load_table(tmp_path / "int8_kernels.json", current_fingerprint())
    assert "onednn-off" in key  # the choice is kept for this CPU with oneDNN off, not for it with oneDNN on


def test_with_onednn_off_a_forced_int_mm_still_runs_and_computes_the_same(onednn_off: None) -> None:
    x, packed, bias = _layer()
    forced = KernelDispatcher(forced="int_mm", kernels=default_kernels(LazyKitchen(lambda: None)))
    scalar = forced.linear(x, packed, bias)
    [choice] = forced.choices().values()
    assert (choice.kernel, choice.source) == ("int_mm", "forced")
    torch._C._set_mkldnn_enabled(True)
    assert torch.equal(scalar, run_kernel("int_mm", x, packed, bias))  # int32 sums: exact either way


def test_a_cpu_without_avx512_vnni_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False)
    assert "no AVX-512 VNNI" in (int_mm_cpu_fallback() or "")
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True)
    assert int_mm_cpu_fallback() is None
    monkeypatch.delattr(torch.cpu, "_is_vnni_supported")  # a torch without the private helper
    monkeypatch.setattr("leanvideo.int8.linear.cpu_flags", lambda: {"avx2", "fma"})
    assert "no AVX-512 VNNI" in (int_mm_cpu_fallback() or "")
    monkeypatch.setattr("leanvideo.int8.linear.cpu_flags", lambda: {"avx2", "avx512_vnni"})
    assert int_mm_cpu_fallback() is None


def test_the_device_says_when_onednn_is_off(onednn_off: None) -> None:
    assert cpu_isa().endswith("onednn-off")
    torch._C._set_mkldnn_enabled(True)
    assert "onednn-off" not in cpu_isa()
