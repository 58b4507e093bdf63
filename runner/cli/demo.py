"""``leanvideo demo``: the tiny LTXV through LeanVideo's INT8 nodes and through stock ComfyUI, side by side.

The library (:mod:`runner.jobs.demo`) runs both and returns the figures; this module parses the
arguments and renders them: a rich table, or with ``--json`` everything as one JSON object.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from runner.cli.render import print_json
from runner.cli.server_options import check_int8_kernel_variable, given_path, port_number, warn_if_not_pinned
from runner.jobs.demo import DemoOutcome, DemoRun, run_demo
from runner.local.out_folder import check_out_folder, remove_empty_folders
from runner.local.workspace import find_workspace

MAX_PORT = 65535


def add_demo_parser(sub: Any) -> None:
    """Add ``demo`` to the ``leanvideo`` sub-commands."""
    demo = sub.add_parser(
        "demo",
        help="tiny LTXV text-to-video through LeanVideo's INT8 nodes and through stock ComfyUI, side by side",
        description="Runs the tiny LTXV twice, each on a fresh local ComfyUI: through LeanVideo's INT8 "
        "loaders with Patch Attention and Free VRAM, then through the stock loaders. Prints model file "
        "bytes, peak RSS, sampling and prompt time and the frame PSNR between the two; writes both MP4s, "
        "a run record beside each and a contact sheet PNG. ComfyUI flags after `--` pass through.",
        epilog="exit codes: 0 done, 2 usage (also a --port in use), 3 not installed, 4 a server did not "
        "start or was lost, 5 a server rejected a demo workflow (another custom node pack that took one of "
        "LeanVideo's node ids: its server's start-up says so), 6 a prompt failed, 130 interrupted",
    )
    demo.add_argument("--out", type=given_path, default=Path("leanvideo-out"), help="output folder")
    demo.add_argument(
        "--port",
        type=demo_port,
        help="the first server's port; the second takes the next one (default: free ones)",
    )
    demo.add_argument("--json", action="store_true", help="print every figure and path as JSON")


def demo_port(text: str) -> int:
    """The first of the demo's two ports (P and P+1), or argparse's usage error."""
    port = port_number(text)
    if port == MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"{text}: the demo takes two ports, P and P+1; give one below {MAX_PORT}"
        )
    return port


def run_demo_command(args: argparse.Namespace, passthrough: tuple[str, ...], console: Console) -> int:
    """``leanvideo demo``: run, then render (table or JSON)."""
    check_int8_kernel_variable(os.environ)
    workspace = find_workspace()
    warn_if_not_pinned(workspace)
    out = args.out.resolve()
    made = check_out_folder(out)
    if not args.json:
        console.print("running the tiny LTXV text-to-video demo: LeanVideo INT8, then stock ComfyUI…")
    try:
        outcome = run_demo(out, workspace, port=args.port, extra_args=passthrough)
    except BaseException:  # refused or stopped before a file was written: no empty --out is left
        remove_empty_folders(made)
        raise
    if args.json:
        print_json(console, outcome.to_json())
        return 0
    console.print(comparison_table(outcome))
    console.print(
        "one run of each, on servers started side by side: bytes, peak RSS and PSNR are what they are; "
        "times move from run to run on a busy machine (`leanvideo bench` repeats and gives the spread)",
        highlight=False,
    )
    if measured := outcome.int8.kernels_measured:
        console.print(
            f"note: the INT8 run timed its kernels for {measured} layer shape(s) first (path=auto, once per "
            "machine, again after `leanvideo kernels --clear`): its sampling and prompt times include "
            "that; run the demo again for steady figures",
            highlight=False,
        )
    console.print(
        f"frame PSNR, {outcome.int8.configuration.label} vs {outcome.stock.configuration.label} "
        f"({len(outcome.int8.frames)} decoded frames, lossless PNG): {_db(outcome.psnr_db)}",
        highlight=False,
    )
    for run in outcome.runs:
        console.print(f"{run.configuration.key + ' video:':<13}{run.video}", highlight=False)
    console.print(f"{'contact sheet:':<15}{outcome.contact_sheet}", highlight=False)
    console.print(
        f"records: {', '.join(str(run.record_path.name) for run in outcome.runs)} (beside the videos)",
        highlight=False,
    )
    console.print(
        f"fixtures {outcome.fixtures_seconds:.1f} s · demo total {outcome.total_seconds:.1f} s",
        highlight=False,
    )
    return 0


def comparison_table(outcome: DemoOutcome) -> Table:
    """One column per configuration, one row per figure, and the INT8/stock ratio."""
    int8, stock = outcome.int8, outcome.stock
    table = Table(title="tiny LTXV text-to-video: same prompt, seed and size (64×64, 9 frames, 8 steps)")
    table.add_column("")
    table.add_column(int8.configuration.label, justify="right")
    table.add_column(stock.configuration.label, justify="right")
    table.add_column("INT8 / stock", justify="right")
    table.add_row("loaders", _loaders(int8), _loaders(stock), "")
    table.add_row("model files", _files(int8), _files(stock), "")
    table.add_row(
        "model file bytes",
        _mb(int8.model_bytes),
        _mb(stock.model_bytes),
        _ratio(int8.model_bytes, stock.model_bytes),
    )
    table.add_row(
        "peak RSS (server process)",
        _mib(int8.peak_rss_bytes),
        _mib(stock.peak_rss_bytes),
        _ratio(int8.peak_rss_bytes, stock.peak_rss_bytes),
    )
    table.add_row(
        "sampling (sampler node)",
        f"{int8.sampling_seconds:.3f} s",
        f"{stock.sampling_seconds:.3f} s",
        _ratio(int8.sampling_seconds, stock.sampling_seconds),
    )
    table.add_row(
        "model loading (loader nodes)",
        f"{int8.loading_seconds:.3f} s",
        f"{stock.loading_seconds:.3f} s",
        _ratio(int8.loading_seconds, stock.loading_seconds),
    )
    table.add_row(
        "memory release (Free VRAM node)",
        f"{int8.release_seconds:.3f} s" if int8.release_seconds else "—",
        f"{stock.release_seconds:.3f} s" if stock.release_seconds else "—",
        "",
    )
    table.add_row(
        "prompt (submit → history)",
        f"{int8.prompt_seconds:.3f} s",
        f"{stock.prompt_seconds:.3f} s",
        _ratio(int8.prompt_seconds, stock.prompt_seconds),
    )
    table.add_row(
        "server start", f"{int8.server_ready_seconds:.1f} s", f"{stock.server_ready_seconds:.1f} s", ""
    )
    return table


def _loaders(run: DemoRun) -> str:
    return "\n".join(dict.fromkeys(file.class_type for file in run.model_files))


def _files(run: DemoRun) -> str:
    return "\n".join(f"{file.name} ({_mb(file.bytes)})" for file in run.model_files)


def _mb(size: int | None) -> str:
    return "—" if size is None else f"{size / 1e6:.1f} MB"


def _mib(size: int | None) -> str:
    return "—" if size is None else f"{size / 2**20:.0f} MiB"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "—" if not ours or not theirs else f"{ours / theirs:.2f}×"


def _db(value: float) -> str:
    return "identical (∞ dB)" if math.isinf(value) else f"{value:.2f} dB"
