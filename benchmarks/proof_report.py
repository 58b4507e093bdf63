"""Gather what ``gpu_seed_table.sh`` measured into the few files a GPU job may hand back.

A job on the GPU machine returns at most 8 files of at most 16 MiB, no more than two folders down.
This module reads the script's results folder, whatever state it is in (a bench killed at the budget
leaves run records but no ``bench.json``), and writes into the destination, in this order of priority:

- ``summary.json``: every figure, compact (schema ``leanvideo.gpu_proof`` v1): the GPU, the steps the
  script named as failed (``failed.txt``), the GPU tests' result (``gpu_tests.txt``), the kernel
  table, per family each variant's median time, spread, speed-up, energy, peak VRAM, phases and
  quality, or why it was skipped or failed, and the runs made when the bench did not finish;
- ``report.md``: the GPU, the kernel table and each family's Markdown table, with the notes;
- ``log.txt``: the script's log (its tail, when it is larger than a file may be);
- per family ``<family>.csv``, then its plots ``<family>-total_time.png`` and ``<family>-phases.png``,
  while files are left.

Example::

    python -m benchmarks.proof_report RESULTS_DIR --into "$OUT" --families "ltxv-13b wan-14b"
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SUMMARY_SCHEMA = "leanvideo.gpu_proof"
SUMMARY_VERSION = 1
MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
PLOTS = ("total_time.png", "phases.png")
VARIANT_KEYS = ("name", "skipped", "failed", "total", "speedup", "significance", "energy_wh")
VARIANT_KEYS += ("peak_vram_bytes", "peak_rss_bytes", "phases", "step_s", "flags", "quality")


def read_gpu(results: Path) -> dict[str, str]:
    """The first GPU row of ``gpu.csv`` (nvidia-smi's CSV), or an empty dict."""
    try:
        rows = list(csv.DictReader((results / "gpu.csv").read_text(encoding="utf-8").splitlines()))
    except OSError:
        return {}
    return {k.strip(): (v or "").strip() for k, v in rows[0].items()} if rows else {}


def summarize_family(folder: Path) -> dict[str, Any]:
    """A family's figures from ``bench.json``, or its finished runs when the bench did not finish."""
    try:
        document = json.loads((folder / "bench.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {"status": "unfinished" if folder.is_dir() else "not run", "runs": _runs(folder)}
    variants = []
    for variant in document.get("variants", []):
        item = {key: variant.get(key) for key in VARIANT_KEYS if variant.get(key) not in (None, {}, [])}
        item["run_totals_s"] = [run["total_s"] for run in variant.get("runs", []) if not run.get("warmup")]
        variants.append(item)
    return {
        "status": "done",
        "matrix": document.get("matrix"),
        "environment": document.get("environment"),
        "variants": variants,
    }


def _runs(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(folder.glob("runs/*/*/run.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        timing = record.get("timing") or {}
        found.append(
            {
                "variant": path.parent.parent.name,
                "status": record.get("status"),
                "wall_s": timing.get("wall_s"),
                "server_execution_s": timing.get("server_execution_s"),
                "phases": timing.get("phases"),
                "error": record.get("error"),
            }
        )
    return found


def read_gpu_tests(results: Path) -> dict[str, Any] | None:
    """``pytest -m gpu``'s last line and its failed tests, from ``gpu_tests.txt`` (None: not run)."""
    lines = _read_text(results / "gpu_tests.txt").strip().splitlines()
    if not lines:
        return None
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {"summary": lines[-1].strip("= "), "failed": failed[:20]}


def build_summary(results: Path, families: list[str]) -> dict[str, Any]:
    """The compact JSON of every figure in ``results`` (see the module docstring)."""
    kernels: Any = None
    with contextlib.suppress(OSError, json.JSONDecodeError):
        kernels = json.loads((results / "int8_linear.json").read_text(encoding="utf-8"))
    return {
        "schema": SUMMARY_SCHEMA,
        "version": SUMMARY_VERSION,
        "created": datetime.now(timezone.utc).isoformat(),
        "gpu": read_gpu(results),
        "failed_steps": _read_text(results / "failed.txt").splitlines(),  # as the script named them
        "gpu_tests": read_gpu_tests(results),
        "int8_linear": kernels,
        "families": {family: summarize_family(results / family) for family in families},
        "int8_auto_choices": {family: int8_auto_choices(results / family) for family in families},
    }


def int8_auto_choices(folder: Path) -> dict[str, Any]:
    """The INT8 kernel tables that ``path=auto`` measured in the family's bench servers (each server's
    ``user/leanvideo/int8_kernels.json``), by server: shape class → chosen kernel and its timings."""
    tables: dict[str, Any] = {}
    for path in sorted(folder.glob("servers/*/**/leanvideo/int8_kernels.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError, AttributeError):
            entries = json.loads(path.read_text(encoding="utf-8")).get("entries", {})
            tables[path.relative_to(folder).parts[1]] = entries
    return tables


def render_report(results: Path, summary: dict[str, Any], families: list[str]) -> str:
    """``report.md``: the GPU, the kernel table, then each family's report (or what it got to)."""
    gpu = summary["gpu"]
    lines = ["# LeanVideo GPU proof", ""]
    lines.append(f"GPU: {', '.join(f'{k} {v}' for k, v in gpu.items()) or 'none found (nvidia-smi)'}")
    lines.append("")
    if summary["failed_steps"]:
        lines += ["Steps that failed or were left out: " + "; ".join(summary["failed_steps"]), ""]
    if (tests := summary["gpu_tests"]) is not None:
        lines += [
            "## GPU tests (pytest -m gpu)",
            "",
            tests["summary"],
            *[f"- {f}" for f in tests["failed"]],
            "",
        ]
    kernel_text = _read_text(results / "int8_linear.txt")
    lines += ["## INT8 linear layers", "", "```", kernel_text.strip() or "(not run)", "```", ""]
    for family in families:
        lines += [f"## {family}", ""]
        report = _read_text(results / family / "report.md")
        if report:
            lines.append(report.strip())
        else:
            state = summary["families"][family]
            lines.append(f"No report ({state['status']}). Runs made:")
            for run in state.get("runs", []):
                wall = run.get("wall_s")
                lines.append(
                    f"- {run['variant']}: {run['status']}, {wall if wall is None else f'{wall:.1f}'} s"
                )
        lines.append("")
    return "\n".join(lines)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def collect(results: Path, into: Path, families: list[str], log: Path | None = None) -> list[Path]:
    """Write the summary, report, log, CSVs and plots into ``into``; returns the files written. What
    does not fit in :data:`MAX_FILES` is named at the end of ``report.md`` (it stays in ``results``)."""
    into.mkdir(parents=True, exist_ok=True)
    summary = build_summary(results, families)
    candidates: list[tuple[Path, str]] = []
    if log is not None:
        candidates.append((log, "log.txt"))
    for family in families:
        candidates.append((results / family / "report.csv", f"{family}.csv"))
    for family in families:
        candidates += [(results / family / plot, f"{family}-{plot}") for plot in PLOTS]
    existing = [(source, name) for source, name in candidates if source.is_file()]
    kept, left = existing[: MAX_FILES - 2], existing[MAX_FILES - 2 :]
    report = render_report(results, summary, families)
    if left:
        names = ", ".join(str(source) for source, _ in left)
        report += f"\nLeft on the machine ({MAX_FILES} files come back at most): {names}\n"
    written = [into / "summary.json", into / "report.md"]
    written[0].write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    written[1].write_text(report, encoding="utf-8")
    for source, name in kept:
        target = into / name
        target.write_bytes(source.read_bytes()[-MAX_FILE_BYTES:])
        written.append(target)
    for source, _ in left:
        print(f"left out ({MAX_FILES} files at most): {source}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.proof_report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, help="gpu_seed_table.sh's results folder")
    parser.add_argument("--into", type=Path, required=True, help="folder for the files handed back")
    parser.add_argument("--families", default="", help="families run, space-separated, in order")
    parser.add_argument("--log", type=Path, default=None, help="the script's log, to hand back too")
    args = parser.parse_args(argv)
    files = collect(args.results, args.into, args.families.split(), args.log)
    for path in files:
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
