"""The INT8 kernel dispatcher when a kernel fails: what goes into the table on disk, and a compile that
failed once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from leanvideo.int8.dispatch import KernelDispatcher, KernelImpl
from leanvideo.int8.kernel_table import current_fingerprint, load_table
from leanvideo.int8.linear import linear_w8a16
from leanvideo.int8.quantize import Int8Weight

from tests.test_int8_dispatch import _fixture, _raising, _w8a16


def test_a_choice_made_while_a_kernel_raised_holds_for_this_process_only(tmp_path: Path) -> None:
    """Out of memory may not happen in the next server: such a choice is not written to the table (nor
    carried into it when a later shape's choice is), so it is measured again."""
    x, packed, bias = _fixture()  # 48 rows

    def flaky(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] > 32:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return linear_w8a16(x, packed, bias)

    table = tmp_path / "int8_kernels.json"
    kernels = {"w8a16": _w8a16(0.02), "flaky": KernelImpl(run=flaky, unsupported=lambda x, p: None)}
    first = KernelDispatcher(cache_path=table, kernels=kernels)
    first.linear(x, packed, bias)
    assert not table.exists()
    first.linear(x[:20], packed, bias)  # another shape class, where it runs: that one is kept
    assert {c.kernel for c in first.choices().values()} == {"w8a16", "flaky"}
    assert [c.kernel for c in load_table(table, current_fingerprint()).values()] == ["flaky"]
    second = KernelDispatcher(cache_path=table, kernels={"w8a16": _w8a16(0.02), "flaky": _w8a16()})
    second.linear(x, packed, bias)  # measured again: now it runs
    assert sorted(c.kernel for c in load_table(table, current_fingerprint()).values()) == ["flaky", "flaky"]
    # a kernel that fails otherwise (a compile, a launch) would fail in the next server too: kept
    table.unlink()
    broken = {"w8a16": _w8a16(), "broken": KernelImpl(run=_raising, unsupported=lambda x, p: None)}
    KernelDispatcher(cache_path=table, kernels=broken).linear(x, packed, bias)
    [kept] = load_table(table, current_fingerprint()).values()
    assert kept.kernel == "w8a16" and kept.rejected["broken"].startswith("error: RuntimeError")


def test_a_failed_compile_of_the_fused_kernel_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo
    from leanvideo.int8.linear import FusedW8A8

    compiled: list[object] = []

    def failing_compile(function: object, **options: object) -> Callable[..., torch.Tensor]:
        compiled.append(function)

        def run(*args: object) -> torch.Tensor:
            raise torch._dynamo.exc.InternalTorchDynamoError("Triton found no compiler")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    fused = FusedW8A8()
    rows, weight_t, scale = torch.randn(20, 64), torch.zeros(64, 8, dtype=torch.int8), torch.ones(1, 8)
    with pytest.raises(torch._dynamo.exc.InternalTorchDynamoError):
        fused(rows, weight_t, scale, None, torch.float32)
    with pytest.raises(
        RuntimeError, match="failed on an earlier call: InternalTorchDynamoError: Triton found"
    ):
        fused(rows[:3], weight_t, scale, None, torch.float32)
    assert len(compiled) == 1
