"""The INT8 end-to-end benchmark's result: the versioned JSON record and the table printed from it.

:func:`build_record` turns the runs of :mod:`benchmarks.int8_e2e_bench` into one record (warmups kept
in ``runs`` but never in a statistic); :func:`print_table` prints it for people. Per configuration the
record has the DiT file and its bytes, the sampler time and the peak RSS summarised
(:func:`benchmarks.stats.summarize`: median, p10/p90, min/max, the spread warning) and whether every
run's frames were identical; across them, the paired int8 / stock sampling ratio (one per pair, then
summarised), the file and peak RSS ratios, the frame PSNR of int8 against stock per pair (``null``
where the frames are identical) and the kernels the INT8 loader reported.

Example::

    record = build_record(settings=settings, files=files, runs=runs, psnrs=psnrs, kernels=kernels,
                          environment=environment, seconds=812.0)
    record["sampling_ratio"]["median"], record["configurations"]["int8"]["kernels"]["counts"]
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leanvideo.int8.device import cpu_isa, cpu_model

from benchmarks.stats import summarize

if TYPE_CHECKING:
    from benchmarks.int8_e2e_bench import BenchSettings, Run
    from benchmarks.mid_dit import MidDitFiles

RECORD_SCHEMA = "leanvideo.int8_e2e_bench"
RECORD_VERSION = 1
STOCK, INT8 = "stock", "int8"
MB, GIB = 1e6, 2**30


def describe_sample(values: Sequence[float]) -> dict[str, Any]:
    """Median, p10/p90, min/max, mean, stdev, n and the spread warning of ``values``, with the values."""
    summary = summarize(values)
    return {
        **asdict(summary),
        "spread_ratio": summary.spread_ratio,
        "spread_warning": summary.spread_warning,
        "values": list(values),
    }


def build_record(
    *,
    settings: BenchSettings,
    files: MidDitFiles,
    runs: Sequence[Run],
    psnrs: Sequence[float],
    kernels: list[dict[str, Any]],
    environment: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """The JSON record of one benchmark run (see the module docstring)."""
    measured = {
        key: [run for run in runs if run.configuration == key and run.pair is not None]
        for key in (STOCK, INT8)
    }
    ratios = [b.sampling_s / a.sampling_s for a, b in zip(measured[STOCK], measured[INT8], strict=True)]
    paths = {STOCK: files.float_path, INT8: files.int8_path}
    configurations = {key: _configuration(key, paths[key], runs) for key in (STOCK, INT8)}
    configurations[INT8]["path"] = settings.kernel
    configurations[INT8]["kernels"] = {
        "report": [run for run in runs if run.configuration == INT8][-1].loader_text,
        "choices": kernels,
        "counts": dict(Counter(choice["kernel"] for choice in kernels)),
    }
    peaks = {key: configurations[key]["peak_rss_bytes"] for key in (STOCK, INT8)}
    loaded = {key: configurations[key]["dit_loaded_bytes"] for key in (STOCK, INT8)}
    finite = [p for p in psnrs if math.isfinite(p)]
    return {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": {**environment, "cpu": cpu_model(), "cpu_isa": cpu_isa()},
        "settings": {
            "pairs": settings.pairs,
            "kernel": settings.kernel,
            "layers": settings.dit.layers,
            "dim": settings.dit.dim,
            "parameters": files.parameters,
            "width": settings.width,
            "height": settings.height,
            "length": settings.length,
            "tokens": settings.tokens,
            "steps": settings.steps,
            "seed": settings.seed,
        },
        "configurations": configurations,
        "file_ratio": configurations[INT8]["file_bytes"] / configurations[STOCK]["file_bytes"],
        "sampling_ratio": describe_sample(ratios),
        "dit_loaded_ratio": loaded[INT8] / loaded[STOCK] if loaded[STOCK] and loaded[INT8] else None,
        "peak_rss_ratio": (
            peaks[INT8]["median"] / peaks[STOCK]["median"] if peaks[STOCK] and peaks[INT8] else None
        ),
        "frame_psnr_db": {
            "per_pair": [p if math.isfinite(p) else None for p in psnrs],  # None: identical frames
            "median": statistics.median(finite) if finite else None,
            "min": min(finite) if finite else None,
            "identical": not finite,
        },
        "runs": [_run_json(run) for run in runs],
        "total_s": round(seconds, 3),
    }


def _configuration(key: str, path: Path, runs: Sequence[Run]) -> dict[str, Any]:
    own = [run for run in runs if run.configuration == key]
    measured = [run for run in own if run.pair is not None]
    peaks = [run.peak_rss_bytes for run in measured if run.peak_rss_bytes is not None]
    loaded = [run.dit_loaded_bytes for run in measured if run.dit_loaded_bytes is not None]
    return {
        "label": "stock UNETLoader (bf16)" if key == STOCK else "Load Diffusion Model (INT8)",
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "sampling_s": describe_sample([run.sampling_s for run in measured]),
        "dit_loaded_bytes": max(loaded) if len(loaded) == len(measured) else None,
        "peak_rss_bytes": describe_sample(peaks) if len(peaks) == len(measured) else None,
        "frames_repeatable": len({run.frames_digest for run in own}) == 1,
    }


def _run_json(run: Run) -> dict[str, Any]:
    return {
        "configuration": run.configuration,
        "pair": run.pair,
        "warmup": run.pair is None,
        "prompt_id": run.prompt_id,
        "sampling_s": run.sampling_s,
        "prompt_s": round(run.prompt_s, 6),
        "peak_rss_bytes": run.peak_rss_bytes,
        "dit_loaded_bytes": run.dit_loaded_bytes,
        "frames_digest": run.frames_digest,
        "kernel_choices_made": run.choices_made,
    }


def write_json(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def print_table(record: dict[str, Any]) -> None:
    """The record for people: one line per configuration, the ratios, the PSNR and the kernels."""
    s, configurations = record["settings"], record["configurations"]
    print(
        f"\nLTXV DiT {s['layers']}×{s['dim']} ({s['parameters'] / 1e6:.1f} M parameters), "
        f"{s['tokens']} tokens, {s['steps']} steps, seed {s['seed']}, "
        f"{s['pairs']} pair(s) after one warmup each; "
        f"{record['environment']['cpu']} [{record['environment'].get('cpu_isa', '?')}], "
        f"torch {record['environment'].get('pytorch_version')}"
    )
    print(
        f"{'configuration':<44}{'DiT file':>11}{'DiT in RAM':>12}  {'sampling s: median [p10–p90]':<30}"
        f"{'peak RSS*':>10}  frames"
    )
    for key, name in ((STOCK, "A"), (INT8, "B")):
        c = configurations[key]
        label = f"{name} {c['label']}" + (f", path={c['path']}" if "path" in c else "")
        t = c["sampling_s"]
        spread = "  (stdev ≥ 10 % of mean)" if t["spread_warning"] else ""
        loaded = f"{c['dit_loaded_bytes'] / MB:.1f} MB" if c["dit_loaded_bytes"] else "n/a"
        peak = f"{c['peak_rss_bytes']['median'] / GIB:.2f} GiB" if c["peak_rss_bytes"] else "n/a"
        frames = "repeatable" if c["frames_repeatable"] else "differ run to run"
        timing = f"{t['median']:.2f} [{t['p10']:.2f}–{t['p90']:.2f}]"
        file = f"{c['file_bytes'] / MB:.1f} MB"
        print(f"{label:<44}{file:>11}{loaded:>12}  {timing:<30}{peak:>10}  {frames}{spread}")
    r = record["sampling_ratio"]
    print(
        f"B / A: file {_ratio(record['file_ratio'])}, DiT in RAM {_ratio(record['dit_loaded_ratio'])}, "
        f"peak RSS* {_ratio(record['peak_rss_ratio'])}; sampling, paired median {r['median']:.3f}× "
        f"(min {r['minimum']:.3f}, p10 {r['p10']:.3f}, p90 {r['p90']:.3f}, max {r['maximum']:.3f}; "
        f"n={r['n']})" + ("  (spread: stdev ≥ 10 % of mean)" if r["spread_warning"] else "")
    )
    print("* the server's peak during the prompt; one server for both, so not isolated (run order matters)")
    psnr = record["frame_psnr_db"]
    if psnr["identical"]:
        print("frame PSNR B vs A: identical frames")
    else:
        print(f"frame PSNR B vs A: {psnr['median']:.2f} dB median over pairs (min {psnr['min']:.2f} dB)")
    kernels = configurations[INT8]["kernels"]
    counts = ", ".join(f"{kernel} ×{n}" for kernel, n in sorted(kernels["counts"].items())) or "none reported"
    print(f"INT8 loader kernels (path={configurations[INT8]['path']}): {counts}")
    for line in kernels["report"].splitlines():
        print(f"  {line}")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}×"
