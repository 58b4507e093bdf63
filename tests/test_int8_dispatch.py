"""INT8 kernel dispatch: numerics of every kernel against the float matmul (SQNR printed), and the
dispatcher's rules — the fastest correct kernel wins, an erroring, inaccurate or slower-than-W8A16
kernel never does, the table on disk is reused and invalidated by a new version, and forcing works.

Timing rules are tested with fault-injecting kernels (a baseline made slow by a sleep, a kernel that
raises, one that returns zeros) so they hold on any machine, however loaded."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, dequantize_weight, dispatch, quantize_weight, sqnr_db
from leanvideo.int8.dispatch import (
    ENV_KERNEL,
    KernelDispatcher,
    KernelImpl,
    LazyKitchen,
    default_kernels,
    forced_kernel,
)
from leanvideo.int8.hadamard import rotate_groups
from leanvideo.int8.kernel_table import current_fingerprint, load_table
from leanvideo.int8.linear import (
    KERNELS,
    FusedW8A8,
    import_kitchen,
    int8_linear,
    int_mm_cpu_fallback,
    linear_w8a16,
    onednn_weights,
    run_kernel,
    unsupported_reason,
)
from leanvideo.int8.onednn import onednn_vnni_missing
from leanvideo.int8.quantize import Int8Weight

KITCHEN = import_kitchen()
FUSED = FusedW8A8()  # int_mm_fused's compiled function
ONEDNN = onednn_weights()  # the onednn kernel's packed weights
KITCHEN_MISSING = "comfy-kitchen does not import here (pip install comfy-kitchen, or .[cuda])"
SHAPES = [(64, 256, 128), (96, 512, 384)]  # (rows, in, out)
CONFIGS = {
    "row": Int8WeightConfig(),
    "tensor": Int8WeightConfig(granularity="tensor"),
    "row-convrot": Int8WeightConfig(convrot=True),
    "row-convrot-v1": Int8WeightConfig(convrot=True, hadamard="sylvester"),  # version-1 files' rotation
}


def _layer(rows: int, in_features: int, out_features: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.02
    x = torch.randn(rows, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) * 0.1
    return weight, x, bias


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_kernel_is_within_35_db_of_the_float_matmul(
    kernel: str, config_name: str, shape: tuple[int, int, int], dtype: torch.dtype
) -> None:
    if kernel == "kitchen" and KITCHEN is None:
        pytest.skip(KITCHEN_MISSING)
    weight, x, bias = _layer(*shape)
    packed = quantize_weight(weight, CONFIGS[config_name])
    reference = torch.nn.functional.linear(x, weight, bias)
    if kernel == "onednn" and (no_vnni := onednn_vnni_missing()) is not None:  # saturating: never run
        assert unsupported_reason(kernel, x.to(dtype), packed) == no_vnni
        forced = int8_linear(x.to(dtype), packed, bias, route="onednn")
        assert torch.equal(forced, linear_w8a16(x.to(dtype), packed, bias))
        return
    assert unsupported_reason(kernel, x.to(dtype), packed, KITCHEN) is None
    out = run_kernel(kernel, x.to(dtype), packed, bias, kitchen=KITCHEN, fused=FUSED, onednn=ONEDNN)
    measured = sqnr_db(reference, out.float())
    print(f"{kernel} {config_name} {shape} {dtype}: {measured:.2f} dB vs float matmul")
    assert out.dtype == dtype and out.shape == reference.shape
    assert measured >= 35.0


def test_comfy_kitchen_rotates_regular_convrot_activations_itself_as_we_would() -> None:
    if KITCHEN is None:
        pytest.skip(KITCHEN_MISSING)
    weight, x, bias = _layer(40, 1024, 256)
    packed = quantize_weight(weight, Int8WeightConfig(convrot=True))
    calls: list[dict[str, object]] = []

    class Recording:
        def int8_linear(self, *args: object, **kwargs: object) -> torch.Tensor:
            calls.append(kwargs)
            return KITCHEN.int8_linear(*args, **kwargs)  # type: ignore[union-attr]

    native = run_kernel("kitchen", x.to(torch.bfloat16), packed, bias, kitchen=Recording())  # type: ignore[arg-type]
    assert calls[-1]["convrot"] is True and calls[-1]["convrot_groupsize"] == 256
    rotated_here = KITCHEN.int8_linear(
        rotate_groups(x.to(torch.bfloat16), 256).to(torch.bfloat16),
        packed.qdata,
        packed.scale.float().reshape(-1),
        bias.to(torch.bfloat16),
        out_dtype=torch.bfloat16,
    )
    assert torch.equal(native, rotated_here)
    legacy = quantize_weight(weight, Int8WeightConfig(convrot=True, hadamard="sylvester"))
    run_kernel("kitchen", x.to(torch.bfloat16), legacy, bias, kitchen=Recording())  # type: ignore[arg-type]
    assert calls[-1]["convrot"] is False  # not comfy-kitchen's matrix: rotated here first


@pytest.mark.parametrize("config_name", ["row", "row-convrot", "row-convrot-v1"])
def test_the_kitchen_kernel_compiles_into_one_graph_and_matches_eager(config_name: str) -> None:
    """Under torch.compile comfy-kitchen runs as one custom op (its fake gives the output's shape), so
    a layer compiles with ``fullgraph=True`` and computes what eager computes."""
    if KITCHEN is None:
        pytest.skip(KITCHEN_MISSING)
    import torch._dynamo

    weight, x, bias = _layer(48, 512, 256)
    packed = quantize_weight(weight, CONFIGS[config_name])
    x3 = x.to(torch.bfloat16).reshape(2, 24, 512)  # a batch of token rows, as a DiT passes them

    def layer(inputs: torch.Tensor) -> torch.Tensor:
        return run_kernel("kitchen", inputs, packed, bias, kitchen=KITCHEN)

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    out = compiled(x3)
    assert out.shape == (2, 24, 256) and out.dtype == torch.bfloat16
    assert torch.equal(out, layer(x3))


def test_w8a8_kernels_refuse_block_scales_and_int8_linear_falls_back() -> None:
    weight, x, _ = _layer(32, 256, 64)
    packed = quantize_weight(weight, Int8WeightConfig(granularity="block", block_size=64))
    for kernel in ("int_mm", "kitchen", "onednn"):
        assert "block-wise" in str(unsupported_reason(kernel, x, packed, KITCHEN))
        assert torch.equal(int8_linear(x, packed, route=kernel), linear_w8a16(x, packed))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'fast'"):
        int8_linear(x, packed, route="fast")  # type: ignore[arg-type]


# --- the dispatcher, with fault-injecting kernels --------------------------------------------------------


def _w8a16(delay: float = 0.0, calls: list[str] | None = None, name: str = "w8a16") -> KernelImpl:
    def run(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        if calls is not None:
            calls.append(name)
        time.sleep(delay)
        return linear_w8a16(x, packed, bias)

    return KernelImpl(run=run, unsupported=lambda x, packed: None)


def _raising(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    raise RuntimeError("no kernel image for this device")


def _zeros(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.zeros(*x.shape[:-1], packed.qdata.shape[0], dtype=x.dtype)


def _fixture() -> tuple[torch.Tensor, Int8Weight, torch.Tensor]:
    weight, x, bias = _layer(48, 256, 128)
    return x, quantize_weight(weight, Int8WeightConfig()), bias


def test_fastest_correct_kernel_wins_and_broken_ones_never_do() -> None:
    x, packed, bias = _fixture()
    calls: list[str] = []
    dispatcher = KernelDispatcher(
        kernels={
            "w8a16": _w8a16(0.02, calls),  # the baseline, made slow
            "broken": KernelImpl(run=_raising, unsupported=lambda x, p: None),
            "wrong": KernelImpl(run=_zeros, unsupported=lambda x, p: None),  # fastest, but wrong
            "absent": KernelImpl(run=_raising, unsupported=lambda x, p: "not installed"),
            "fast": _w8a16(0.0, calls, "fast"),
        }
    )
    out = dispatcher.linear(x, packed, bias)
    [(key, choice)] = dispatcher.choices().items()
    print(key, choice)
    assert choice.kernel == "fast" and choice.source == "measured"
    assert choice.rejected["broken"].startswith("error: RuntimeError: no kernel image")
    assert choice.rejected["wrong"].startswith("inaccurate:")
    assert choice.rejected["absent"] == "unsupported: not installed"
    assert set(choice.seconds) == {"w8a16", "fast"}
    assert choice.ratios()["fast"] < 1.0
    assert torch.equal(out, linear_w8a16(x, packed, bias))
    assert "|128x256|rows<=64|row" in key
    calls.clear()
    dispatcher.linear(x, packed, bias)  # measured once per shape class: now only the winner runs
    assert calls == ["fast"]
    dispatcher.linear(x[:20], packed, bias)  # another row bucket is another shape class
    assert len(dispatcher.choices()) == 2


def test_a_kernel_that_loses_to_w8a16_is_never_chosen() -> None:
    x, packed, bias = _fixture()
    dispatcher = KernelDispatcher(kernels={"w8a16": _w8a16(), "slow": _w8a16(0.02, name="slow")})
    dispatcher.linear(x, packed, bias)
    [choice] = dispatcher.choices().values()
    assert choice.kernel == "w8a16"
    assert choice.rejected == {"slow": "slower than w8a16"}
    assert choice.ratios()["slow"] > 1.0


def test_one_slow_call_does_not_rule_a_kernel_out() -> None:
    """A burst of other work on the machine can slow any single call: a kernel is only ruled out early
    after several timed calls, so one slow first call does not hand a faster kernel's shape to w8a16."""
    calls = 0

    def bursty(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        nonlocal calls
        calls += 1
        time.sleep(0.06 if calls <= 2 else 0.0)  # the warmup and the first timed call hit a burst
        return linear_w8a16(x, packed, bias)

    x, packed, bias = _fixture()
    dispatcher = KernelDispatcher(
        kernels={"w8a16": _w8a16(0.005), "bursty": KernelImpl(run=bursty, unsupported=lambda x, p: None)}
    )
    dispatcher.linear(x, packed, bias)
    (choice,) = dispatcher.choices().values()
    # its warmup, its timed calls, and the call whose output the first use returns
    assert choice.kernel == "bursty" and calls == 2 + dispatcher.runs, choice


def test_a_kernel_is_not_charged_for_the_kernel_timed_before_it() -> None:
    """A call pays for what the previous call left behind (freed memory, evicted caches): timed always
    right after w8a16, a kernel that is fast on its own would lose the shape to w8a16."""
    last: list[str] = [""]

    def after(name: str, seconds: Callable[[str], float]) -> KernelImpl:
        def run(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
            time.sleep(seconds(last[0]))
            last[0] = name
            return linear_w8a16(x, packed, bias)

        return KernelImpl(run=run, unsupported=lambda x, p: None)

    kernels = {
        # margins far above a loaded machine's noise in the real matmul both run (a 5 ms one was not)
        "w8a16": after("w8a16", lambda previous: 0.03),
        "fast": after("fast", lambda previous: 0.3 if previous == "w8a16" else 0.0),  # slowed by w8a16
    }
    x, packed, bias = _fixture()
    dispatcher = KernelDispatcher(kernels=kernels)
    dispatcher.linear(x, packed, bias)
    (choice,) = dispatcher.choices().values()
    assert choice.kernel == "fast", choice


def test_table_is_reused_from_disk_and_a_new_version_invalidates_it(tmp_path: Path) -> None:
    x, packed, bias = _fixture()
    table = tmp_path / "user" / "int8_kernels.json"
    first = KernelDispatcher(cache_path=table, kernels={"w8a16": _w8a16(0.02), "fast": _w8a16()})
    first.linear(x, packed, bias)
    saved = json.loads(table.read_text())
    assert saved["fingerprint"] == current_fingerprint()
    assert [c["kernel"] for c in saved["entries"].values()] == ["fast"]

    calls: list[str] = []
    kernels = {"w8a16": _w8a16(0.0, calls), "fast": _w8a16(0.0, calls, "fast")}
    KernelDispatcher(cache_path=table, kernels=kernels).linear(x, packed, bias)
    assert calls == ["fast"]  # read from the table: nothing measured

    for changed in ({"torch": "9.9.9"}, {"comfy_kitchen": "0.0.1"}):
        calls.clear()
        fingerprint = current_fingerprint() | changed
        assert load_table(table, fingerprint) == {}
        KernelDispatcher(cache_path=table, kernels=kernels, fingerprint=fingerprint).linear(x, packed, bias)
        assert sorted(set(calls)) == ["fast", "w8a16"]  # measured again
        assert json.loads(table.read_text())["fingerprint"] == fingerprint


def test_a_damaged_table_is_said_once_and_written_whole_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Read at start and again before each save (to merge what other processes measured): only the
    first read says it is ignored; the save replaces it with a readable table."""
    table = tmp_path / "int8_kernels.json"
    table.write_text("{damaged", encoding="utf-8")
    dispatcher = KernelDispatcher(cache_path=table, kernels={"w8a16": _w8a16(0.02), "fast": _w8a16()})
    for rows in (8, 64):  # two shape classes: two saves
        x, packed, bias = _fixture()
        dispatcher.linear(x[:rows], packed, bias)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING and str(table) in r.getMessage()]
    assert len(said) == 1 and "Ignoring unreadable INT8 kernel table" in said[0].getMessage()
    assert len(load_table(table, current_fingerprint())) == 2


def test_a_table_from_a_cpu_with_other_int8_instructions_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clouds name CPUs with and without VNNI alike ("AMD EPYC"): the instruction sets are part of
    the device in the table, so a workspace moved to another CPU measures again."""
    x, packed, bias = _fixture()
    table = tmp_path / "int8_kernels.json"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    KernelDispatcher(cache_path=table, kernels={"w8a16": _w8a16(0.02), "fast": _w8a16()}).linear(
        x, packed, bias
    )
    (device,) = {key.split("|", 1)[0] for key in load_table(table, current_fingerprint())}
    assert device.startswith("cpu:") and f"[{torch.backends.cpu.get_cpu_capability()}" in device

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN (torch._int_mm on CPU) capped: another machine
    calls: list[str] = []
    kernels = {"w8a16": _w8a16(0.0, calls), "fast": _w8a16(0.0, calls, "fast")}
    KernelDispatcher(cache_path=table, kernels=kernels).linear(x, packed, bias)
    assert sorted(set(calls)) == ["fast", "w8a16"]  # measured again, not taken from the first CPU's row
    devices = {key.split("|", 1)[0] for key in load_table(table, current_fingerprint())}
    assert len(devices) == 2 and any("onednn<=AVX2" in d for d in devices)


def test_unreadable_table_is_ignored_and_rewritten(tmp_path: Path) -> None:
    table = tmp_path / "int8_kernels.json"
    table.write_text("{not json")
    x, packed, bias = _fixture()
    dispatcher = KernelDispatcher(cache_path=table, kernels={"w8a16": _w8a16()})
    assert dispatcher.choices() == {}
    dispatcher.linear(x, packed, bias)
    assert len(load_table(table, current_fingerprint())) == 1


def test_comfy_kitchen_is_imported_only_when_its_kernel_is_asked_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(On a CPU without AVX-512 VNNI no W8A8 kernel is measured, kitchen's included, so the test makes
    every CPU measure them, as one with VNNI does.)"""
    monkeypatch.setattr(dispatch, "int_mm_cpu_fallback", lambda: None)
    imports: list[str] = []

    def importer() -> ModuleType | None:
        imports.append("comfy_kitchen")
        return KITCHEN

    x, packed, bias = _fixture()
    table = tmp_path / "t.json"
    forced = KernelDispatcher(forced="w8a16", kernels=default_kernels(LazyKitchen(importer)))
    forced.linear(x, packed, bias)
    assert imports == []  # a forced kernel: comfy-kitchen never needed
    measuring = KernelDispatcher(cache_path=table, kernels=default_kernels(LazyKitchen(importer)))
    measuring.linear(x, packed, bias)
    measuring.linear(x, packed, bias)
    assert imports == ["comfy_kitchen"]  # asked about once while measuring, then remembered
    from_table = KernelDispatcher(cache_path=table, kernels=default_kernels(LazyKitchen(importer)))
    from_table.linear(x, packed, bias)
    (choice,) = from_table.choices().values()  # read from the table, not measured
    assert len(imports) == (2 if choice.kernel == "kitchen" else 1)  # imported only to run its kernel


def test_forced_kernel_runs_where_it_can_and_w8a16_elsewhere(tmp_path: Path) -> None:
    calls: list[str] = []
    kernels = {"w8a16": _w8a16(0.0, calls), "int_mm": _w8a16(0.0, calls, "int_mm")}
    kernels["int_mm"] = KernelImpl(
        run=kernels["int_mm"].run,
        unsupported=lambda x, p: "block-wise" if p.config.granularity == "block" else None,
    )
    table = tmp_path / "t.json"
    dispatcher = KernelDispatcher(forced="int_mm", kernels=kernels, cache_path=table)
    x, packed, bias = _fixture()
    dispatcher.linear(x, packed, bias)
    assert calls == ["int_mm"]  # forced: nothing measured
    block = quantize_weight(
        torch.randn(128, 256) * 0.02, Int8WeightConfig(granularity="block", block_size=64)
    )
    dispatcher.linear(x, block, None)
    assert calls == ["int_mm", "w8a16"]
    sources = sorted((c.kernel, c.source) for c in dispatcher.choices().values())
    assert sources == [("int_mm", "forced"), ("w8a16", "fallback")]
    assert not table.exists()  # forced choices are not measurements: nothing cached
    assert "forced int_mm" in dispatcher.summary()
    with pytest.raises(ValueError, match="'fast'"):
        KernelDispatcher(forced="fast")


def test_a_forced_kernel_that_fails_falls_back_to_w8a16_for_its_shape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """path=int_mm_fused on a machine with no C++ compiler: its first call raises InvalidCxxCompiler. The
    prompt failed; the forced kernel now runs w8a16 there, said once, as where it cannot run a shape."""
    calls: list[str] = []
    kernels = {
        "w8a16": _w8a16(0.0, calls),
        "int_mm_fused": KernelImpl(run=_raising, unsupported=lambda x, p: None),
    }
    dispatcher = KernelDispatcher(forced="int_mm_fused", kernels=kernels)
    x, packed, bias = _fixture()
    assert torch.equal(dispatcher.linear(x, packed, bias), linear_w8a16(x, packed, bias))
    dispatcher.linear(x, packed, bias)  # remembered: not tried again
    assert calls == ["w8a16", "w8a16"]
    (choice,) = dispatcher.choices().values()
    assert (choice.kernel, choice.source) == ("w8a16", "fallback")
    assert choice.rejected == {"int_mm_fused": "error: RuntimeError: no kernel image for this device"}
    assert caplog.text.count("forced INT8 kernel int_mm_fused failed") == 1


def test_a_table_entry_naming_an_unknown_kernel_is_measured_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table edited by hand (or by another LeanVideo) named kernel 'bogus': sampling failed with
    KeyError: 'bogus'."""
    kernels = {"w8a16": _w8a16(0.01), "int_mm": _w8a16(0.0, name="int_mm")}
    table = tmp_path / "t.json"
    x, packed, bias = _fixture()
    KernelDispatcher(kernels=kernels, cache_path=table, runs=2).linear(x, packed, bias)
    document = json.loads(table.read_text(encoding="utf-8"))
    (entry,) = document["entries"].values()
    entry["kernel"] = "bogus"
    table.write_text(json.dumps(document), encoding="utf-8")
    again = KernelDispatcher(kernels=kernels, cache_path=table, runs=2)
    assert again.choices() == {}
    assert (
        f"INT8 kernel table {table} names kernel(s) bogus, which this LeanVideo does not have" in caplog.text
    )
    again.linear(x, packed, bias)
    assert [c.kernel for c in again.choices().values()] == ["int_mm"]


def test_a_forced_kernel_wins_over_the_measured_table(tmp_path: Path) -> None:
    """path=w8a16 on a server whose table measured int_mm for the shape: w8a16 runs, the table stays."""
    calls: list[str] = []
    kernels = {"w8a16": _w8a16(0.01, calls), "int_mm": _w8a16(0.0, calls, "int_mm")}
    table = tmp_path / "t.json"
    x, packed, bias = _fixture()
    KernelDispatcher(kernels=kernels, cache_path=table, runs=2).linear(x, packed, bias)
    (measured,) = load_table(table, current_fingerprint()).values()
    assert measured.kernel == "int_mm"
    calls.clear()
    forced = KernelDispatcher(forced="w8a16", kernels=kernels, cache_path=table)
    forced.linear(x, packed, bias)
    forced.linear(x, packed, bias)
    assert calls == ["w8a16", "w8a16"]
    assert [c.source for c in forced.choices().values()] == ["forced"]
    assert "table" not in forced.summary() and "forced w8a16" in forced.summary()
    assert load_table(table, current_fingerprint()) == {next(iter(forced.choices())): measured}


def test_forcing_by_input_and_environment() -> None:
    assert forced_kernel("auto", {}) is None
    assert forced_kernel("auto", {ENV_KERNEL: "kitchen"}) == "kitchen"
    assert forced_kernel("auto", {ENV_KERNEL: "auto"}) is None
    assert forced_kernel("w8a16", {ENV_KERNEL: "kitchen"}) == "w8a16"  # the node's input wins
    assert forced_kernel("w8a8", {}) == "int_mm"  # the older name
    with pytest.raises(ValueError, match=f"{ENV_KERNEL}='cublas'"):
        forced_kernel("auto", {ENV_KERNEL: "cublas"})
    with pytest.raises(ValueError, match="'fast'"):
        forced_kernel("fast", {})
    # the report says what forced it when the node asked for auto: else the user cannot tell why
    by_environment = KernelDispatcher(forced="onednn", forced_by=ENV_KERNEL, cache_path=None)
    assert by_environment.mode() == f"forced onednn ({ENV_KERNEL})"
    assert KernelDispatcher(forced="onednn", cache_path=None).mode() == "forced onednn"


def test_the_clis_kernel_choices_are_the_loaders() -> None:
    """The CLI checks LEANVIDEO_INT8_KERNEL before it starts servers without importing torch: its copy
    of the loaders' path choices must stay theirs."""
    from leanvideo.int8.linear import MATMUL_ROUTES

    from runner.cli.server_options import INT8_KERNEL_CHOICES, INT8_KERNEL_VARIABLE

    assert INT8_KERNEL_CHOICES == MATMUL_ROUTES and INT8_KERNEL_VARIABLE == ENV_KERNEL


def test_real_kernels_measured_on_this_device(tmp_path: Path) -> None:
    x, packed, bias = _fixture()
    dispatcher = KernelDispatcher(cache_path=tmp_path / "t.json")
    out = dispatcher.linear(x, packed, bias)
    [choice] = dispatcher.choices().values()
    print(dispatcher.summary({(128, 256, "row")}))
    assert choice.kernel in KERNELS
    assert "w8a16" in choice.seconds
    assert choice.seconds[choice.kernel] <= choice.seconds["w8a16"]
    if (scalar_loop := int_mm_cpu_fallback()) is not None:  # a CPU without AVX-512 VNNI: asked first
        assert scalar_loop in choice.rejected["kitchen"] and scalar_loop in choice.rejected["int_mm"]
    elif KITCHEN is None:
        assert choice.rejected["kitchen"].startswith("unsupported: comfy-kitchen is not installed")
    else:
        assert "kitchen" in choice.seconds and "int_mm" in choice.seconds
    assert sqnr_db(torch.nn.functional.linear(x, dequantize_weight(packed), bias), out) >= 35.0
    assert "128x256 rows<=64 float32 row" in dispatcher.summary({(128, 256, "row")})
    first = dispatcher.summary({(128, 256, "row")}).splitlines()[0]  # what was chosen, read first
    assert first == f"INT8 kernels: {dispatcher.mode()}: {choice.kernel} on 1 of 1 shape class(es)"
    assert "1 weight shape(s) not run yet" in dispatcher.summary({(128, 256, "row"), (64, 64, "row")})
    # another model's layer of that shape, rotated: the choice is not its own (the loader's report listed it)
    rotated = dispatcher.summary({(128, 256, "row+convrot256")})
    assert "128x256" not in rotated and "1 weight shape(s) not run yet" in rotated


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "onednn"])  # onednn: a CPU kernel
@pytest.mark.parametrize("config_name", ["row", "row-convrot"])
def test_cuda_kernels_match_the_float_matmul(kernel: str, config_name: str) -> None:
    if kernel == "kitchen" and KITCHEN is None:
        pytest.skip(KITCHEN_MISSING)
    weight, x, bias = (t.cuda() for t in _layer(256, 1024, 512))
    packed = quantize_weight(weight, CONFIGS[config_name])  # convrot: comfy-kitchen's fused rotation
    assert unsupported_reason(kernel, x, packed, KITCHEN) is None
    out = run_kernel(kernel, x.to(torch.bfloat16), packed, bias, kitchen=KITCHEN, fused=FUSED)
    measured = sqnr_db(torch.nn.functional.linear(x, weight, bias), out.float())
    print(f"{kernel} on {torch.cuda.get_device_name()}: {measured:.2f} dB vs float matmul")
    assert out.is_cuda and out.dtype == torch.bfloat16
    assert measured >= 35.0


@pytest.mark.gpu
def test_cuda_dispatch_measures_and_never_loses_to_w8a16(tmp_path: Path) -> None:
    weight, x, bias = (t.cuda() for t in _layer(4096, 4096, 4096))
    packed = quantize_weight(weight, Int8WeightConfig())
    dispatcher = KernelDispatcher(cache_path=tmp_path / "t.json")
    dispatcher.linear(x.to(torch.bfloat16), packed, bias)
    [choice] = dispatcher.choices().values()
    print(dispatcher.summary())
    assert choice.seconds[choice.kernel] <= choice.seconds["w8a16"]
    assert "int_mm" in choice.seconds or "int_mm" in choice.rejected
