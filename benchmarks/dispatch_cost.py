"""What ``path=auto`` costs per call on top of the kernel it chose: the dispatcher's own work (the
layer's shape class, the table look-up), measured where it shows most, at a layer small enough that
the kernel takes microseconds.

Both paths run the same kernel on the same weight, timed in the same interleaved rounds
(:func:`benchmarks.timing.sample_interleaved`); the cost is the median over rounds of auto's sample
less the kernel's. At DiT shapes, where a layer takes a millisecond or more, a few microseconds are
well under a percent: auto's time there is its kernel's (``benchmarks/int8_bench.py`` prints both).

Example::

    cost = dispatch_cost(torch.device("cpu"))
    print(describe_cost(cost))
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight
from leanvideo.int8.dispatch import CUDA_CALLS_PER_SAMPLE, KernelDispatcher, default_kernels

from benchmarks.timing import sample_interleaved

AUTO, DIRECT = "auto", "kernel"
ROUNDS = 200
TOKENS, IN_FEATURES, OUT_FEATURES = 32, 256, 256  # microseconds per call on any device


def dispatch_cost(device: torch.device, rounds: int = ROUNDS) -> dict[str, Any]:
    """auto against the kernel it chose, at :data:`TOKENS` × :data:`IN_FEATURES` → :data:`OUT_FEATURES`
    on ``device``: both medians and the median paired difference, in microseconds."""
    generator = torch.Generator(device=device).manual_seed(2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weight = torch.randn(OUT_FEATURES, IN_FEATURES, generator=generator, device=device) * 0.02
    x = torch.randn(TOKENS, IN_FEATURES, generator=generator, device=device).to(dtype)
    packed = quantize_weight(weight, Int8WeightConfig())
    dispatcher = KernelDispatcher(kernels=default_kernels(None))  # comfy-kitchen is not needed here
    dispatcher.linear(x, packed)  # the measurement at first use
    [choice] = dispatcher.choices().values()
    kernel = dispatcher.kernels[choice.kernel]
    on_gpu = device.type == "cuda"
    samples = sample_interleaved(
        {AUTO: lambda: dispatcher.linear(x, packed), DIRECT: lambda: kernel.run(x, packed, None)},
        runs=rounds,
        sync=torch.cuda.synchronize if on_gpu else None,
        calls=CUDA_CALLS_PER_SAMPLE if on_gpu else 1,
    )
    differences = [a - k for a, k in zip(samples[AUTO], samples[DIRECT], strict=True)]
    return {
        "shape": f"[{TOKENS}×{IN_FEATURES}] @ [{IN_FEATURES}×{OUT_FEATURES}]",
        "kernel": choice.kernel,
        "rounds": rounds,
        "kernel_us": statistics.median(samples[DIRECT]) * 1e6,
        "auto_us": statistics.median(samples[AUTO]) * 1e6,
        "cost_us": statistics.median(differences) * 1e6,
    }


def describe_cost(cost: dict[str, Any]) -> str:
    """One line for the table: the cost, and what it was measured on."""
    return (
        f"auto's own cost per call: {cost['cost_us']:.1f} µs (median of {cost['rounds']} paired rounds "
        f"at {cost['shape']}: {cost['kernel']} {cost['kernel_us']:.1f} µs run directly, "
        f"{cost['auto_us']:.1f} µs through auto)"
    )
