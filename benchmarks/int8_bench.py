"""INT8 against bf16, measured side by side in one run: bytes on disk and in memory, load time,
quantize throughput and peak RSS, and linear throughput per INT8 kernel at real DiT shapes.

Run: ``.venv/bin/python benchmarks/int8_bench.py [--model ltxv-13b|wan-14b] [--tokens 512] [--out FILE]
[--json TABLE] [--linear-models ltxv-13b,wan-14b,ltxv-mid] [--device cuda] [--convrot] [--no-onednn]
[--fused-mode max-autotune-no-cudagraphs]``.
The linear benchmark runs on ``--device`` (CUDA when present). Per shape it times the float matmul (fp32
on a CPU, what ComfyUI computes in there; bf16 on a GPU), every INT8 kernel that runs there (w8a16,
int_mm, int_mm_fused, kitchen when comfy-kitchen imports, onednn on a CPU with VNNI or AMX), ``auto``
(the dispatcher, after the measurement it makes at first use, whose time is reported too),
``torch._int_mm`` alone on activations quantized beforehand (what a W8A8 kernel built on it costs at
least) and w8a16 compiled by torch.compile (what dequantizing in one pass gains), each as a ratio of the
float matmul, timed in interleaved rounds (one call of each path per round, so load from other processes
falls on every path alike), with the device synchronised around every timed sample (on a GPU 8 calls
back to back round 4 weight copies, as auto times them); each kernel's output is also checked against
the fp32 matmul (SQNR), and a kernel that raises is reported with its error while the others are still
measured. ``--convrot`` quantizes the layers with ConvRot (comfy-kitchen then rotates activations in its
own kernel). ``--no-onednn`` runs the linear part with oneDNN off: ``torch._int_mm`` then runs the
scalar loop torch runs on every CPU without AVX-512 VNNI (AVX2-only, AVX-VNNI-only), so any machine
shows what such a CPU gets; the ``onednn`` kernel does not ask that switch and still runs (with
``ONEDNN_MAX_CPU_ISA=AVX2_VNNI`` as well, a CPU with AVX-512 VNNI shows what an AVX-VNNI-only one gets).
``--fused-mode`` compiles ``int_mm_fused`` (its row and auto's candidate) in that torch.compile mode
instead of inductor's default (:data:`leanvideo.int8.linear.FUSED_MODES`: on a GPU, max-autotune may
fuse the rescale into an int8 Triton matmul). ``--json`` writes that table as a list of ``{shape,
kernel, ratio}`` (``{shape, kernel, error}`` for a kernel that raised) and ``{shape, auto,
auto_over_best, auto_over_chosen, chosen_over_best}``: auto's median over the best kernel's median,
auto over the kernel it chose round by round (the median of the per-round ratios: what dispatching
costs, with drift between rounds cancelled; two medians taken apart differ by the machine's noise,
several % on a busy CPU), and that kernel's median over the best one's (whether it chose well).

Method (pyperf-style): warmup runs are discarded; each value is the median of the measured runs,
with p10/p90 (:func:`benchmarks.stats.summarize`); a warning marks spreads with stdev ≥ 10 % of the
mean. The result is one versioned JSON record (with its environment) printed first, then a table.
File and load measurements (:mod:`benchmarks.int8_files`) use one transformer block's Linear weights
of the chosen model (random N(0, 0.02), bf16), with a warm page cache, so load time is CPU/memory-bound
here, not disk-bound.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight, sqnr_db
from leanvideo.int8.dispatch import CUDA_CALLS_PER_SAMPLE, WEIGHT_COPIES, KernelDispatcher, default_kernels
from leanvideo.int8.linear import (
    FUSED_MODES,
    KERNELS,
    FusedW8A8,
    import_kitchen,
    onednn_weights,
    quantize_activations,
    run_kernel,
    unsupported_reason,
)
from leanvideo.int8.quantize import Int8Weight, dequantize

from benchmarks.dispatch_cost import describe_cost, dispatch_cost
from benchmarks.int8_files import bench_files, print_files
from benchmarks.int8_table import AUTO, environment, kernel_table, print_linear
from benchmarks.timing import Timing, paired_ratio, sample_interleaved

RECORD_SCHEMA = "leanvideo.int8_bench"
# 2: linear rows on --device, "baseline" and "relative_to_baseline"; 3: p10/p90 linearly interpolated
# (benchmarks.stats), where 2 took the run at index int(q · runs); 4: one row per kernel (w8a16, int_mm,
# kitchen) and auto, "ratio" to the float matmul on the device, auto's choice, an ffn-down shape;
# 5: "sqnr_db" per kernel row (against the fp32 matmul), "error" rows for kernels that raised, auto's
# "rejected" kernels, --convrot shapes, the comfy-kitchen version in the environment; 6: int_mm_fused
# rows, "int8 matmul alone" and "w8a16 compiled" rows; 7: auto's "first_use_s" (its measurement), the
# environment's "onednn" (false with --no-onednn); 8: on a GPU a sample is 8 calls back to back round 4
# weight copies (7 synchronised around every call); 9: "fused_mode", int_mm_fused's torch.compile mode;
# 10: auto's "auto_over_chosen" (paired per round) and "chosen_over_best"; "dispatch", auto's own cost
# per call (benchmarks.dispatch_cost; null with --skip-linear)
RECORD_VERSION = 10
FLOAT = "float matmul"  # fp32 on a CPU (what ComfyUI computes in there), bf16 on a GPU
# torch._int_mm on activations quantized beforehand: no kernel (its output is int32), the floor every
# W8A8 kernel built on it stands on, so a table shows how much of int_mm's time is quantizing/rescaling
INT_MM_ALONE = "int8 matmul alone"
# w8a16 with dequantize and matmul compiled by torch.compile (dequantizing in one pass, where eager makes
# three): no kernel auto chooses, a measurement of what such a kernel would gain on this device
W8A16_COMPILED = "w8a16 compiled"
# hidden size, FFN width and block count of the real models ("ltxv-mid": the mid LTXV DiT's widths)
MODELS: dict[str, tuple[int, int, int]] = {
    "ltxv-13b": (4096, 16384, 48),
    "wan-14b": (5120, 13824, 40),
    "ltxv-mid": (1024, 4096, 8),
}
logger = logging.getLogger(__name__)


def _going_round(functions: list[Callable[[], object]]) -> Callable[[], object]:
    """One callable that calls the next of ``functions`` each time (a sample's calls go round weight
    copies, as a model's layers read one weight after another from memory)."""
    following = itertools.cycle(functions)
    return lambda: next(following)()


def _w8a16_graph(
    x: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, config: Int8WeightConfig
) -> torch.Tensor:
    return torch.nn.functional.linear(x, dequantize(qdata, scale, config, x.dtype))


def _compiled_w8a16(x: torch.Tensor, weights: list[Int8Weight]) -> Callable[[], object] | None:
    """The :data:`W8A16_COMPILED` path, compiled and run once; ``None`` (logged) where it cannot compile."""
    compiled = torch.compile(_w8a16_graph, dynamic=True)
    try:
        compiled(x, weights[0].qdata, weights[0].scale, weights[0].config)
    except Exception as exc:  # a diagnostic row: its absence is reported, the table goes on
        logger.warning("%s left out: %s: %s", W8A16_COMPILED, type(exc).__name__, exc)
        return None
    return _going_round([lambda w=w: compiled(x, w.qdata, w.scale, w.config) for w in weights])


@dataclass
class ShapeRun:
    """One shape's measurements: timings by label, each kernel's SQNR against the fp32 matmul, the
    kernels that raised (their error), auto's choice with the kernels it ruled out (and why), the
    seconds its first call took (the measurement), and auto's time over its chosen kernel's, round by
    round (the dispatcher's own cost per call, drift between rounds cancelled)."""

    timings: dict[str, Timing]
    sqnr_db: dict[str, float]
    errors: dict[str, str]
    chose: str
    rejected: dict[str, str]
    first_use_s: float
    auto_over_chosen: float


def _bench_shape(
    out_features: int,
    in_features: int,
    tokens: int,
    runs: int,
    device: torch.device,
    *,
    convrot: bool = False,
    fused_mode: str | None = None,
) -> ShapeRun:
    """The float matmul, every INT8 kernel that runs here, and ``auto`` at one shape. Inputs are bf16
    on a GPU, fp32 on a CPU (what ComfyUI computes in). A kernel that raises is left out with its error,
    so one broken kernel does not lose the others' figures. On a GPU each sample is
    :data:`CUDA_CALLS_PER_SAMPLE` calls back to back round :data:`WEIGHT_COPIES` copies of the weight,
    as the dispatcher times them (one weight would sit in the GPU's cache; a sync per call would charge
    a kernel of several launches their latency, which a model's queue of layers hides)."""
    generator = torch.Generator(device=device).manual_seed(1)
    weight = torch.randn(out_features, in_features, generator=generator, device=device) * 0.02
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(tokens, in_features, generator=generator, device=device).to(dtype)
    reference = torch.nn.functional.linear(x.float(), weight)
    packed = quantize_weight(weight, Int8WeightConfig(convrot=convrot))
    on_gpu = device.type == "cuda"
    sync: Callable[[], None] | None = torch.cuda.synchronize if on_gpu else None
    calls, copies = (CUDA_CALLS_PER_SAMPLE, WEIGHT_COPIES) if on_gpu else (1, 1)
    packs = [packed, *(packed.clone() for _ in range(copies - 1))]
    floats = [weight.to(dtype) for _ in range(copies)]
    paths: dict[str, Callable[[], object]] = {
        FLOAT: _going_round([lambda w=w: torch.nn.functional.linear(x, w) for w in floats])
    }
    kitchen, fused, onednn = import_kitchen(), FusedW8A8(fused_mode), onednn_weights()
    quality: dict[str, float] = {}
    errors: dict[str, str] = {}
    for kernel in KERNELS:
        if (reason := unsupported_reason(kernel, x, packed, kitchen)) is not None:
            logger.info("%s left out at %s×%s: %s", kernel, out_features, in_features, reason)
            continue
        try:
            out = run_kernel(kernel, x, packed, kitchen=kitchen, fused=fused, onednn=onednn)
        except Exception as exc:  # a kernel that cannot run here is a finding, not a crash
            errors[kernel] = f"{type(exc).__name__}: {exc}"
            logger.warning("%s raised at %s×%s: %s", kernel, out_features, in_features, errors[kernel])
            continue
        quality[kernel] = sqnr_db(reference, out.float())
        paths[kernel] = _going_round(
            [
                lambda k=kernel, p=p: run_kernel(k, x, p, kitchen=kitchen, fused=fused, onednn=onednn)
                for p in packs
            ]
        )
    if "int_mm" in paths:
        x_q, _ = quantize_activations(x.reshape(-1, in_features))
        transposed = [p.qdata.t() for p in packs]
        paths[INT_MM_ALONE] = _going_round([lambda t=t: torch._int_mm(x_q, t) for t in transposed])
    if (w8a16_compiled := _compiled_w8a16(x, packs)) is not None:
        paths[W8A16_COMPILED] = w8a16_compiled
    dispatcher = KernelDispatcher(kernels=default_kernels(kitchen, fused_mode))
    started = time.perf_counter()
    dispatcher.linear(x, packed)  # the measurement auto makes at first use
    if sync is not None:
        sync()
    first_use_s = time.perf_counter() - started
    [choice] = dispatcher.choices().values()
    paths[AUTO] = _going_round([lambda p=p: dispatcher.linear(x, p) for p in packs])
    samples = sample_interleaved(paths, runs=runs, sync=sync, calls=calls)
    timings = {label: Timing.of(values) for label, values in samples.items()}
    over_chosen = paired_ratio(samples[AUTO], samples[choice.kernel])
    return ShapeRun(timings, quality, errors, choice.kernel, dict(choice.rejected), first_use_s, over_chosen)


def bench_linear(
    model: str,
    tokens: int,
    runs: int,
    device: torch.device,
    *,
    convrot: bool = False,
    fused_mode: str | None = None,
) -> list[dict[str, Any]]:
    """Every kernel and ``auto`` at the model's attention and FFN shapes, relative to the float matmul;
    kernel rows carry their SQNR against the fp32 matmul, a kernel that raised gets an ``error`` row."""
    hidden, ffn, _ = MODELS[model]
    results = []
    for name, (out_features, in_features) in {
        "attn": (hidden, hidden),
        "ffn up": (ffn, hidden),
        "ffn down": (hidden, ffn),
    }.items():
        run = _bench_shape(
            out_features, in_features, tokens, runs, device, convrot=convrot, fused_mode=fused_mode
        )
        base = run.timings[FLOAT].median_s
        # the best of the kernels auto may choose here (not one it does not measure on this device)
        eligible = [k for k in KERNELS if not run.rejected.get(k, "").startswith("not measured")]
        best = min(t.median_s for label, t in run.timings.items() if label in eligible)
        rotated = " convrot" if convrot else ""
        shape = f"{model} {name}{rotated}: [{tokens}×{in_features}] @ [{in_features}×{out_features}]"
        for label, timing in run.timings.items():
            row = {"shape": shape, "kernel": label, **asdict(timing), "ratio": timing.median_s / base}
            if label in run.sqnr_db:
                row["sqnr_db"] = run.sqnr_db[label]
            if label == AUTO:
                row |= {
                    "chose": run.chose,
                    "auto_over_best": timing.median_s / best,
                    "auto_over_chosen": run.auto_over_chosen,
                    "chosen_over_best": run.timings[run.chose].median_s / best,
                }
                row["first_use_s"] = run.first_use_s
                row["rejected"] = run.rejected
            results.append(row)
        results += [{"shape": shape, "kernel": k, "error": e} for k, e in run.errors.items()]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="ltxv-13b", help="file/load benchmark shapes"
    )
    parser.add_argument("--tokens", type=int, default=512, help="activation rows in the linear benchmark")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per value (after one warmup)")
    parser.add_argument("--out", type=Path, help="also write the JSON record here")
    parser.add_argument(
        "--json", type=Path, help="write the kernel table here: [{shape, kernel, ratio}, {shape, auto}, ...]"
    )
    parser.add_argument(
        "--linear-models",
        default=",".join(MODELS),
        help=f"comma-separated models whose shapes the linear part measures (of {', '.join(MODELS)})",
    )
    parser.add_argument(
        "--convrot", action="store_true", help="linear part: ConvRot layers (group 256), as --convrot files"
    )
    parser.add_argument("--skip-linear", action="store_true", help="only the file/load/quantize part")
    parser.add_argument("--skip-files", action="store_true", help="only the linear part")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="linear benchmark device"
    )
    parser.add_argument(
        "--no-onednn",
        action="store_true",
        help="oneDNN off: torch._int_mm runs the scalar loop of CPUs without AVX-512 VNNI (AVX2-only)",
    )
    parser.add_argument(
        "--fused-mode",
        choices=[mode or "default" for mode in FUSED_MODES],
        default="default",
        help="torch.compile mode of int_mm_fused (default: inductor's default)",
    )
    args = parser.parse_args()
    fused_mode = None if args.fused_mode == "default" else args.fused_mode
    if args.no_onednn:
        torch._C._set_mkldnn_enabled(False)  # torch.backends.mkldnn.flags() without its TF32 warning
    device = torch.device(args.device)
    files: dict[str, Any] = {}
    if not args.skip_files:
        with tempfile.TemporaryDirectory(prefix="int8-bench-") as directory:
            files = bench_files(*MODELS[args.model][:2], Path(directory))
    models = [m.strip() for m in args.linear_models.split(",") if m.strip()]
    if unknown := [m for m in models if m not in MODELS]:
        parser.error(f"--linear-models: unknown {unknown}; known: {sorted(MODELS)}")
    linear: dict[str, list[dict[str, Any]]] = {}
    if args.json:  # the table so far, from the start: a run cut short (a GPU call's limit) keeps it
        args.json.write_text(json.dumps(kernel_table(linear), indent=1))
    for model in [] if args.skip_linear else models:
        linear[model] = bench_linear(
            model, args.tokens, args.runs, device, convrot=args.convrot, fused_mode=fused_mode
        )
        print_linear(model, linear[model], device, fused_mode)  # said and written as each model ends
        sys.stdout.flush()
        if args.json:
            args.json.write_text(json.dumps(kernel_table(linear), indent=1))
    dispatch = None if args.skip_linear else dispatch_cost(device)
    if dispatch is not None:
        print(f"\n{describe_cost(dispatch)}")
    record = {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "environment": environment(),
        "files_model": args.model,
        "linear_device": str(device),
        "fused_mode": args.fused_mode,
        "files": files,
        "linear": linear,
        "dispatch": dispatch,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    if files:
        print_files(args.model, files)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
