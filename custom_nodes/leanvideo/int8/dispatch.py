"""Pick the INT8 kernel per device and layer-shape class by measuring the candidates at first use.

A :class:`KernelDispatcher` is made per model load and held by that model's ops class. The first time a
layer of a new :class:`ShapeClass` runs (device, dtype, weight shape, activation rows rounded up to a
power of two, weight layout), it runs every candidate kernel of :mod:`.linear` on that very input:

1. a kernel that cannot run the shape, raises, or disagrees with ``w8a16`` (SQNR below
   :data:`MIN_AGREEMENT_DB`) is rejected, with the reason kept; so is one whose ``cpu_skip`` gives a
   reason, on a CPU: every kernel that ends in ``torch._int_mm`` where that runs its scalar loop (no
   AVX-512 VNNI, :func:`.linear.int_mm_cpu_fallback`: measuring it would cost seconds per shape to
   lose; ``onednn`` does not end there) and ``int_mm_fused`` anyway (compiling it costs every server
   seconds there, for a few %);
2. the remaining kernels are timed in ``runs`` interleaved rounds (device synchronised, on a GPU after
   :data:`CUDA_CALLS_PER_SAMPLE` calls back to back, round :data:`WEIGHT_COPIES` copies of the weight;
   each kernel's fastest call counts, so load from other processes hurts every candidate alike; a
   kernel whose best of its first :data:`EARLY_STOP_MIN_SAMPLES` calls is slower than
   :data:`EARLY_STOP_RATIO` × ``w8a16`` has lost and is not run again);
3. the fastest wins, but only if it beats ``w8a16``: a kernel that lost to ``w8a16`` is never chosen.

The choice is kept in a table written to ``cache_path`` (:mod:`.kernel_table`: one file, invalidated by
a new torch or comfy-kitchen version), so later loads and servers skip the measurement. ``forced``
(the ``path`` input, or ``LEANVIDEO_INT8_KERNEL``) runs one kernel wherever it can run the shape and
``w8a16`` elsewhere. Every new choice is logged and passed to ``on_choice`` (telemetry).

Example::

    dispatcher = KernelDispatcher(cache_path=Path("user/leanvideo/int8_kernels.json"))
    y = dispatcher.linear(x, packed, bias)
    print(dispatcher.summary())
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .device import describe_device
from .dispatch_report import WeightShape, summarize
from .kernel_table import Choice, ShapeClass, current_fingerprint, describe_choice, load_table, save_table
from .linear import (
    KERNELS,
    MATMUL_ROUTES,
    FusedW8A8,
    import_kitchen,
    int_mm_cpu_fallback,
    kernel_of_route,
    onednn_weights,
    run_kernel,
    unsupported_reason,
)
from .quantize import Int8Weight, sqnr_db

logger = logging.getLogger(__name__)

ENV_KERNEL = "LEANVIDEO_INT8_KERNEL"
MIN_AGREEMENT_DB = 30.0  # a W8A8 kernel agrees with W8A16 at ≈ 40 dB; far below means a wrong kernel
EARLY_STOP_RATIO = 3.0
# timed calls a kernel gets before it can be ruled out early: one slow call is often a burst of other
# work on the machine, not the kernel (a busy CPU once cached int_mm at 9.8× w8a16 on a shape where it
# runs at 0.14×)
EARLY_STOP_MIN_SAMPLES = 3
DEFAULT_RUNS = 5
# On a GPU each timed sample is this many calls back to back, then one sync: a model runs its layers
# without a sync between them, and one call per sync would charge a kernel of several launches their
# latency (tens of µs beside a 0.2 ms matmul), which the GPU hides in a model.
CUDA_CALLS_PER_SAMPLE = 8
WEIGHT_COPIES = 4  # the weights a GPU's timed calls go round (more than its cache holds at DiT shapes)
AGREEMENT_ROWS = 256  # evenly spaced output rows the agreement is measured on: an estimate suffices
RunKernel = Callable[[torch.Tensor, Int8Weight, "torch.Tensor | None"], torch.Tensor]
Unsupported = Callable[[torch.Tensor, Int8Weight], "str | None"]
OnChoice = Callable[[str, Choice], None]


@dataclass(frozen=True)
class KernelImpl:
    """One candidate: how to run it, why it cannot run a shape (``None`` when it can), why ``auto``
    does not measure it on this CPU (``None``: it does; forcing it runs it there either way), and how
    to drop what it keeps for a weight (``onednn``'s packed copy) once it lost that weight's shape."""

    run: RunKernel
    unsupported: Unsupported
    cpu_skip: Callable[[], str | None] = lambda: None
    forget: Callable[[Int8Weight], None] = lambda packed: None


class LazyKitchen:
    """comfy-kitchen, imported the first time its kernel is asked about: importing it costs 0.17 s on
    a CPU (more with its CUDA backend), and a model whose shapes are all in the kernel table, or whose
    kernel is forced, never needs it. ``module`` is a plain attribute once :meth:`get` has run, so a
    kernel that was measured before ``torch.compile`` traces without a call into the import system."""

    def __init__(self, importer: Callable[[], ModuleType | None] = import_kitchen) -> None:
        self._importer = importer
        self.loaded = False
        self.module: ModuleType | None = None

    def get(self) -> ModuleType | None:
        if not self.loaded:
            self.module, self.loaded = self._importer(), True
        return self.module


def default_kernels(
    kitchen: ModuleType | LazyKitchen | None, fused_mode: str | None = None
) -> dict[str, KernelImpl]:
    """The kernels of :mod:`.linear`; ``kitchen`` is comfy-kitchen (imported, or imported when first
    needed), or ``None`` without it; ``fused_mode`` is int_mm_fused's torch.compile mode."""

    def module() -> ModuleType | None:
        return kitchen.get() if isinstance(kitchen, LazyKitchen) else kitchen

    fused = FusedW8A8(fused_mode)  # int_mm_fused's compiled function, shared by this dispatcher's calls
    onednn = onednn_weights()  # the onednn kernel's packed weights, each kept while its weight lives

    def compiles() -> str | None:
        # on a CPU it gains a few % per layer, and compiling costs each server 2–10 s
        return int_mm_cpu_fallback() or "it compiles, seconds per server"

    def impl(name: str) -> KernelImpl:
        if name == "onednn":
            return KernelImpl(
                run=lambda x, packed, bias: run_kernel(name, x, packed, bias, onednn=onednn),
                unsupported=lambda x, packed: unsupported_reason(name, x, packed),
                forget=lambda packed: onednn.forget(packed.qdata),
            )
        if name != "kitchen":  # only the kitchen kernel needs comfy-kitchen imported
            return KernelImpl(
                run=lambda x, packed, bias: run_kernel(name, x, packed, bias, fused=fused),
                unsupported=lambda x, packed: unsupported_reason(name, x, packed),
                cpu_skip=compiles if name == "int_mm_fused" else int_mm_cpu_fallback,
            )
        return KernelImpl(  # comfy-kitchen's eager backend, the one it has for a CPU, ends in torch._int_mm
            run=lambda x, packed, bias: run_kernel(name, x, packed, bias, kitchen=module()),
            unsupported=lambda x, packed: unsupported_reason(name, x, packed, module()),
            cpu_skip=int_mm_cpu_fallback,
        )

    return {name: impl(name) for name in KERNELS}


class KernelDispatcher:
    """Chooses and runs the INT8 kernel per shape class (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        forced: str | None = None,
        cache_path: Path | None = None,
        kernels: Mapping[str, KernelImpl] | None = None,
        runs: int = DEFAULT_RUNS,
        on_choice: OnChoice | None = None,
        fingerprint: dict[str, object] | None = None,
        forced_by: str | None = None,
    ) -> None:
        if forced is not None and forced not in KERNELS:
            raise ValueError(f"forced kernel must be one of {KERNELS}, not {forced!r}")
        if runs < 1:
            raise ValueError(f"runs must be at least 1, not {runs}")
        self.forced = forced
        self.forced_by = forced_by  # what forced it, said in the report (LEANVIDEO_INT8_KERNEL)
        self.cache_path = cache_path
        self.kernels = dict(kernels) if kernels is not None else default_kernels(LazyKitchen())
        if "w8a16" not in self.kernels:
            raise ValueError("the kernels must include the w8a16 baseline")
        self.runs = runs
        self.on_choice = on_choice
        self.fingerprint = dict(fingerprint) if fingerprint is not None else current_fingerprint()
        self._lock = threading.RLock()
        self._devices: dict[torch.device, str] = {}
        # A forced kernel runs wherever it can: the measured table is neither read nor written then.
        self._table = (
            self._known(load_table(cache_path, self.fingerprint)) if cache_path and not forced else {}
        )

    def _known(self, table: dict[str, Choice]) -> dict[str, Choice]:
        """``table`` without entries naming a kernel this dispatcher lacks (a table edited by hand, or
        written by another LeanVideo): those shapes are measured again."""
        unknown = sorted({c.kernel for c in table.values() if c.kernel not in self.kernels})
        if unknown:
            logger.warning(
                "INT8 kernel table %s names kernel(s) %s, which this LeanVideo does not have: those shapes "
                "are measured again",
                self.cache_path,
                ", ".join(unknown),
            )
        return {key: choice for key, choice in table.items() if choice.kernel in self.kernels}

    # --- running ----------------------------------------------------------------------------------

    def linear(self, x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` on the kernel chosen for this shape class (measured on first use)."""
        shape = ShapeClass.of(x, packed, self._device(x.device))
        choice = self._table.get(shape.key)
        if choice is None and torch.compiler.is_compiling():
            choice = Choice("w8a16", "fallback", rejected={"auto": "not measured inside torch.compile"})
        if choice is None:
            with self._lock:
                choice = self._table.get(shape.key)
                if choice is None:
                    return self._decide(shape, x, packed, bias)
        return self.kernels[choice.kernel].run(x, packed, bias)

    def _device(self, device: torch.device) -> str:
        name = self._devices.get(device)
        if name is None:
            name = self._devices[device] = describe_device(device)
        return name

    def _decide(
        self, shape: ShapeClass, x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if self.forced is not None:
            reason = (
                self.kernels[self.forced].unsupported(x, packed)
                if self.forced in self.kernels
                else ("not available")
            )
            if reason is None:
                try:  # its first call compiles (int_mm_fused) or loads (kitchen): a failure is said once
                    output = self.kernels[self.forced].run(x, packed, bias)
                except Exception as exc:
                    logger.warning("forced INT8 kernel %s failed on %s: %s", self.forced, tuple(x.shape), exc)
                    reason = f"error: {type(exc).__name__}: {exc}"
                else:
                    self._remember(shape, Choice(self.forced, "forced"), persist=False)
                    return output
            why = reason if reason.startswith("error: ") else f"unsupported: {reason}"
            self._remember(shape, Choice("w8a16", "fallback", rejected={self.forced: why}), persist=False)
            return self.kernels["w8a16"].run(x, packed, bias)
        choice, output = self._measure(x, packed, bias)
        # A kernel that ran out of memory may run in the next server: a choice made without it holds
        # for this process only, and the next one measures again.
        self._remember(shape, choice, persist=not _errored(choice))
        return output

    def _measure(
        self, x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None
    ) -> tuple[Choice, torch.Tensor]:
        sync = _synchronizer(x.device)
        rejected: dict[str, str] = {}
        # Only w8a16's output is kept (for the agreement of the others): first use runs in a prompt,
        # whose peak memory must not hold every candidate's output.
        reference: torch.Tensor | None = None
        candidates: list[str] = []
        for name in ("w8a16", *[k for k in self.kernels if k != "w8a16"]):
            kernel = self.kernels[name]
            # asked first: telling whether comfy-kitchen can run a shape imports it
            if name != "w8a16" and x.device.type == "cpu" and (skip := kernel.cpu_skip()) is not None:
                rejected[name] = f"not measured on a CPU ({skip}); path={name} forces it"
                continue
            if name != "w8a16" and (reason := kernel.unsupported(x, packed)) is not None:
                rejected[name] = f"unsupported: {reason}"
                continue
            try:
                output = kernel.run(x, packed, bias)  # warmup, and the output checked below
                sync()
            except Exception as exc:  # any failure rules the kernel out for this shape
                if name == "w8a16":
                    raise
                rejected[name] = f"error: {type(exc).__name__}: {exc}"
                logger.warning("INT8 kernel %s failed on %s: %s", name, tuple(x.shape), exc)
                continue
            if reference is None:
                reference = output
            elif (why := _disagreement(reference, output)) is not None:
                rejected[name] = f"inaccurate: {why}"
                continue
            del output
            candidates.append(name)
        seconds = self._time_rounds(candidates, x, packed, bias, sync)
        best = min(seconds, key=seconds.__getitem__)  # ties go to w8a16, timed first
        for name, value in seconds.items():
            if name != "w8a16" and name != best and value >= seconds["w8a16"]:
                rejected[name] = "slower than w8a16"
        choice = Choice(best, "measured", seconds, rejected)
        for name, kernel in self.kernels.items():  # what a kernel that lost keeps for this weight goes
            if name != best:
                kernel.forget(packed)
        if best == "w8a16":
            assert reference is not None  # w8a16 runs first, and its failure is raised
            return choice, reference
        del reference
        return choice, self.kernels[best].run(x, packed, bias)

    def _time_rounds(
        self,
        names: list[str],
        x: torch.Tensor,
        packed: Int8Weight,
        bias: torch.Tensor | None,
        sync: Callable[[], None],
    ) -> dict[str, float]:
        """Each kernel's fastest of ``runs`` calls, in interleaved rounds so that a burst of other work on
        the machine slows every candidate alike; every other round runs in reverse order, because a
        call pays for what the one before it left behind (W8A16 frees a dequantized weight, and the
        next call's allocations fault in fresh pages), and a fixed order would charge one kernel for
        its neighbour every time. A kernel whose best of its first ``EARLY_STOP_MIN_SAMPLES`` calls
        is past ``EARLY_STOP_RATIO`` × ``w8a16`` has lost and sits out the remaining rounds."""
        times: dict[str, list[float]] = {name: [] for name in names}
        calls = CUDA_CALLS_PER_SAMPLE if x.device.type == "cuda" else 1
        # On a GPU the back-to-back calls go round copies of the weight: in a model each layer's weight
        # comes from memory, and one weight used again and again would sit in the GPU's cache (an H200's
        # 60 MB holds a 5120×5120 int8 weight), favouring whichever kernel reads it directly.
        weights = [packed, *(packed.clone() for _ in range(WEIGHT_COPIES - 1))] if calls > 1 else [packed]
        for round_index in range(self.runs):
            for name in names if round_index % 2 == 0 else names[::-1]:
                samples = times[name]
                if (
                    name != "w8a16"
                    and len(samples) >= EARLY_STOP_MIN_SAMPLES
                    and min(samples) > EARLY_STOP_RATIO * min(times["w8a16"])
                ):
                    continue
                started = time.perf_counter()
                for call in range(calls):
                    self.kernels[name].run(x, weights[call % len(weights)], bias)
                sync()
                times[name].append((time.perf_counter() - started) / calls)
        return {name: min(values) for name, values in times.items()}

    def _remember(self, shape: ShapeClass, choice: Choice, *, persist: bool) -> None:
        self._table[shape.key] = choice
        logger.info("INT8 kernel for %s", describe_choice(shape.key, choice))
        if persist and self.cache_path is not None:
            # Merge with what other processes measured since this table was read.
            on_disk = load_table(self.cache_path, self.fingerprint, quiet=True)  # said when first read
            measured = {k: c for k, c in self._table.items() if c.source == "measured" and not _errored(c)}
            save_table(self.cache_path, self.fingerprint, on_disk | measured)
        if self.on_choice is not None:
            try:
                self.on_choice(shape.key, choice)
            except Exception:  # reporting must never break a forward pass
                logger.exception("Reporting the INT8 kernel choice failed")

    # --- reporting --------------------------------------------------------------------------------

    def choices(self) -> dict[str, Choice]:
        """Every choice this dispatcher knows (read from the cache or made since), by shape class key."""
        with self._lock:
            return dict(self._table)

    def mode(self) -> str:
        if not self.forced:
            return "auto (measured at first use per layer shape)"
        return f"forced {self.forced}" + (f" ({self.forced_by})" if self.forced_by else "")

    def summary(self, weight_shapes: set[WeightShape] | None = None) -> str:
        """The report (:func:`~.dispatch_report.summarize`): the mode, the known choices (for
        ``weight_shapes`` only, ``(out, in, layout)``, when given), shapes not run yet, the cache file."""
        table = self.cache_path if self.forced is None else None
        return summarize(self.mode(), self.choices(), weight_shapes, forced=self.forced, table=table)


def _errored(choice: Choice) -> bool:
    """Whether a kernel was ruled out by running out of memory, which the next server may not (a
    failed compile or launch would fail there too: kept, until a new torch or kernel library)."""
    return any(why.startswith("error: OutOfMemoryError") for why in choice.rejected.values())


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _disagreement(reference: torch.Tensor, output: torch.Tensor) -> str | None:
    if output.shape != reference.shape or output.dtype != reference.dtype:
        got, expected = (f"{tuple(t.shape)} {t.dtype}" for t in (output, reference))
        return f"output {got}, expected {expected}"
    rows = reference.reshape(-1, reference.shape[-1]) if reference.ndim else reference.reshape(1, 1)
    # an odd stride meets every row offset of a kernel's tiles, and the last (partial) tile is kept
    step = max(1, rows.shape[0] // AGREEMENT_ROWS) | 1
    picked = torch.cat([torch.arange(0, rows.shape[0], step), torch.tensor([rows.shape[0] - 1])])
    picked = torch.unique(picked).to(rows.device)
    sample = output.reshape(rows.shape).index_select(0, picked)
    agreement = sqnr_db(rows.index_select(0, picked).float(), sample.float())
    return None if agreement >= MIN_AGREEMENT_DB else f"{agreement:.1f} dB against w8a16"


def forced_kernel(path: str, environ: Mapping[str, str]) -> str | None:
    """The kernel forced by a loader's ``path`` input, or when it is ``auto`` by ``LEANVIDEO_INT8_KERNEL``
    in ``environ``; ``None`` means measure. Raises ``ValueError`` naming a bad value."""
    forced = kernel_of_route(path)
    if forced is not None:
        return forced
    value = environ.get(ENV_KERNEL, "").strip()
    if not value or value == "auto":
        return None
    if value not in MATMUL_ROUTES:
        raise ValueError(f"{ENV_KERNEL}={value!r} is not one of {MATMUL_ROUTES}")
    return kernel_of_route(value)
