"""What ``benchmarks/int8_bench.py`` writes and prints: the ``--json`` kernel table, the environment of
its record, and the linear table on the terminal.

Example::

    rows = bench_linear("ltxv-mid", 384, 5, torch.device("cpu"))      # benchmarks.int8_bench
    print_linear("ltxv-mid", rows, torch.device("cpu"))
    json.dumps(kernel_table({"ltxv-mid": rows}))
"""

from __future__ import annotations

import platform
from typing import Any

import torch
from leanvideo.int8.device import cpu_isa, cpu_model, onednn_on
from leanvideo.int8.linear import import_kitchen

AUTO = "auto"


def kernel_table(linear: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The ``--json`` list: ``{shape, kernel, ratio}`` per kernel (and for auto), then ``{shape, auto}``."""
    table: list[dict[str, Any]] = []
    for rows in linear.values():
        for row in rows:
            if "error" in row:
                table.append({"shape": row["shape"], "kernel": row["kernel"], "error": row["error"]})
                continue
            table.append({"shape": row["shape"], "kernel": row["kernel"], "ratio": row["ratio"]})
            if row["kernel"] == AUTO:
                ratios = ("auto_over_best", "auto_over_chosen", "chosen_over_best")
                table.append({"shape": row["shape"], "auto": row["chose"], **{k: row[k] for k in ratios}})
    return table


def environment() -> dict[str, Any]:
    """Versions and the device facts a kernel's time depends on (CPU, its int8 instructions, threads)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pack = version("leanvideo")
    except PackageNotFoundError:
        pack = "unknown"
    kitchen = None  # not installed or does not import (the kitchen rows say which)
    if import_kitchen() is not None:
        try:
            kitchen = version("comfy-kitchen")
        except PackageNotFoundError:
            kitchen = "imports, no package metadata"
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),  # torch's CPU kernels, int8 dot-product flags, any oneDNN cap
        "threads": torch.get_num_threads(),
        "onednn": onednn_on(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "leanvideo": pack,
        "comfy_kitchen": kitchen,
    }


def print_linear(
    model: str, rows: list[dict[str, Any]], device: torch.device, fused_mode: str | None = None
) -> None:
    """``model``'s rows as a table: each kernel's time, its ratio to the float matmul, its SQNR, and
    what auto chose and ruled out."""
    float_name = "bf16" if device.type == "cuda" else "fp32"
    mode = f" (int_mm_fused compiled in torch.compile mode {fused_mode})" if fused_mode else ""
    print(f"\nlinear on {device}, {model}{mode}: time as a multiple of the {float_name} matmul")
    for row in rows:
        if "error" in row:
            print(f"  {row['shape']:<48} {row['kernel']:<18} raised {row['error']}")
            continue
        flag = "  (unstable: stdev ≥ 10 % of mean)" if row["unstable"] else ""
        timing = f"{row['median_s'] * 1e3:8.2f} ms  {row['ratio']:.2f}×"
        quality = f"  {row['sqnr_db']:5.1f} dB" if "sqnr_db" in row else ""
        chose = (
            f"  chose {row['chose']} (measured in {row['first_use_s']:.2f} s), "
            f"{row['auto_over_best']:.3f}× the best kernel it may choose (round by round "
            f"{row['auto_over_chosen']:.3f}× {row['chose']} itself, which took "
            f"{row['chosen_over_best']:.3f}× the best)"
            if "chose" in row
            else ""
        )
        print(f"  {row['shape']:<48} {row['kernel']:<18} {timing}{quality}{chose}{flag}")
        for kernel, why in (row.get("rejected") or {}).items():
            print(f"      {kernel} ruled out: {why}")
