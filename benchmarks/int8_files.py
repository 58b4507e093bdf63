"""INT8 against bf16 for one transformer block's Linear weights: bytes on disk and in memory, load
time, quantize throughput and peak RSS (``benchmarks/int8_bench.py`` without ``--skip-files``).

Weights are random N(0, 0.02) in bf16; the page cache is warm, so load time is CPU/memory-bound here,
not disk-bound. The quantizer runs in a fresh process whose RSS is sampled, so the peak is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from leanvideo.int8.formats import read_int8_file
from safetensors.torch import load_file, save_file

from benchmarks.timing import measure


def block_weights(hidden: int, ffn: int) -> dict[str, torch.Tensor]:
    """One LTXV-style transformer block's Linear weights (self/cross attention and FFN), bf16."""
    generator = torch.Generator().manual_seed(0)
    shapes = {f"transformer_blocks.0.attn{a}.to_{p}.weight": (hidden, hidden) for a in (1, 2) for p in "qkv"}
    shapes |= {f"transformer_blocks.0.attn{a}.to_out.0.weight": (hidden, hidden) for a in (1, 2)}
    shapes |= {
        "transformer_blocks.0.ff.net.0.proj.weight": (ffn, hidden),
        "transformer_blocks.0.ff.net.2.weight": (hidden, ffn),
    }
    return {k: (torch.randn(s, generator=generator) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}


_CHILD_QUANTIZE = """
import json, sys, threading, time
from pathlib import Path
import psutil
from leanvideo.int8.convert import quantize_file
import tempfile
import torch
from safetensors.torch import save_file
# Warm up on a small file first so one-time runtime set-up (thread pools, allocator arenas, lazy
# imports) is not counted as the quantizer's working memory.
with tempfile.TemporaryDirectory() as scratch:
    small = Path(scratch) / "small.safetensors"
    zeros = torch.zeros(256, 256, dtype=torch.bfloat16)
    save_file({"transformer_blocks.0.ff.net.2.weight": zeros}, str(small))
    quantize_file(small, Path(scratch) / "small-int8.safetensors", family="ltxv")
process = psutil.Process()
baseline = peak = process.memory_info().rss
done = threading.Event()
def sample():
    global peak
    while not done.is_set():
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.002)
sampler = threading.Thread(target=sample)
sampler.start()
started = time.perf_counter()
quantize_file(Path(sys.argv[1]), Path(sys.argv[2]), family="ltxv")
seconds = time.perf_counter() - started
done.set()
sampler.join()
print(json.dumps({"seconds": seconds, "peak_over_baseline_bytes": peak - baseline}))
"""


def _child_quantize(source: Path, target: Path) -> dict[str, float]:
    """Quantize in a fresh process, sampling its RSS, so the peak is the quantizer's own."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_QUANTIZE, str(source), str(target)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_files(hidden: int, ffn: int, directory: Path) -> dict[str, Any]:
    """One block's Linear weights at these widths, bf16 against INT8: file and memory bytes, load time
    (warm page cache), quantize throughput and the quantizer's peak RSS (a fresh process)."""
    weights = block_weights(hidden, ffn)
    largest = max(t.numel() * t.element_size() for t in weights.values())
    bf16_path, int8_path = directory / "block-bf16.safetensors", directory / "block-int8.safetensors"
    save_file(weights, str(bf16_path), {"config": "{}"})
    quantize = _child_quantize(bf16_path, int8_path)
    bf16_bytes, int8_bytes = bf16_path.stat().st_size, int8_path.stat().st_size
    loaded = read_int8_file(int8_path).tensors
    memory_int8 = sum(
        t.numel() * t.element_size() for k, t in loaded.items() if not k.endswith(".comfy_quant")
    )
    memory_bf16 = sum(t.numel() * t.element_size() for t in weights.values())
    # safetensors maps files lazily: copy every tensor so the bytes are really read.
    load_bf16 = measure(lambda: [t.clone() for t in load_file(str(bf16_path)).values()], runs=7)
    load_int8 = measure(lambda: [t.clone() for t in read_int8_file(int8_path).tensors.values()], runs=7)
    return {
        "block_linear_params": sum(t.numel() for t in weights.values()),
        "disk_bytes": {"bf16": bf16_bytes, "int8": int8_bytes, "ratio": int8_bytes / bf16_bytes},
        "memory_bytes": {"bf16": memory_bf16, "int8": memory_int8, "ratio": memory_int8 / memory_bf16},
        "load": {
            "bf16": asdict(load_bf16),
            "int8": asdict(load_int8),
            "ratio": load_int8.median_s / load_bf16.median_s,
        },
        "quantize": {
            "mb_per_s": bf16_bytes / 1e6 / quantize["seconds"],
            "seconds": quantize["seconds"],
            "peak_rss_increase_mib": quantize["peak_over_baseline_bytes"] / 2**20,
            "largest_tensor_mib": largest / 2**20,
            "peak_over_largest_tensor": quantize["peak_over_baseline_bytes"] / largest,
        },
    }


def print_files(model: str, files: dict[str, Any]) -> None:
    print(
        f"\n{model} block Linear weights: disk INT8/bf16 = {files['disk_bytes']['ratio']:.4f}×, "
        f"memory = {files['memory_bytes']['ratio']:.4f}×, load time = {files['load']['ratio']:.3f}×; "
        f"quantize {files['quantize']['mb_per_s']:.0f} MB/s, "
        f"peak RSS +{files['quantize']['peak_rss_increase_mib']:.0f} MiB "
        f"= {files['quantize']['peak_over_largest_tensor']:.2f}× the largest tensor "
        f"({files['quantize']['largest_tensor_mib']:.0f} MiB)"
    )
