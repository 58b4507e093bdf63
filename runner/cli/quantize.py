"""``leanvideo quantize IN OUT``: write a float safetensors model in the LeanVideo INT8 format.

Thin CLI over :func:`leanvideo.int8.convert.quantize_file`: it streams tensor by tensor, refuses to
overwrite OUT, verifies the written file, and reports the size ratio and per-layer SQNR. Errors
propagate as :mod:`runner.errors` (exit 1 bad input, 2 usage: also an OUT that exists or cannot be written).

Wiring (in ``runner/cli/main.py``)::

    add_quantize_parser(sub)
    ...
    if args.command == "quantize":
        return run_quantize(args, console)
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from runner.cli.render import print_json
from runner.errors import LeanVideoError, UsageError

if TYPE_CHECKING:
    from leanvideo.int8.convert import QuantizeReport
    from leanvideo.int8.spec import Int8WeightConfig

# The families of leanvideo.int8.policy.FAMILY_RULES (a test keeps them equal). Listed here so that
# building the parser, and so `leanvideo --help` or any other command, does not import torch.
FAMILIES = ("flux", "hunyuan_video", "ltxv", "text_encoder", "wan")

WORST_LAYERS_SHOWN = 5
OUT_SUFFIXES = (".safetensors", ".sft")
DEFAULT_CONVROT_GROUP = 256  # as Int8WeightConfig's default


def add_quantize_parser(subparsers: Any) -> None:
    """Add the ``quantize`` command to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    parser = subparsers.add_parser(
        "quantize",
        help="write a float or fp8 safetensors model as LeanVideo INT8",
        description="Quantize IN (bf16/fp16/fp32, float8_e4m3fn/e5m2 or ComfyUI scaled fp8 safetensors) to "
        "OUT in the LeanVideo INT8 format (ComfyUI-native metadata included). Sensitive layers stay in high "
        "precision. LoRAs and VAEs are not quantized.",
        epilog="exit codes: 0 written and verified, 1 bad input, 2 usage (also an OUT that exists, is a "
        "folder or a link, or is not named .safetensors), 130 interrupted (nothing left behind)",
    )
    parser.add_argument("input", type=Path, metavar="IN", help="float or fp8 .safetensors file")
    parser.add_argument("output", type=Path, metavar="OUT", help="new .safetensors file (never overwritten)")
    parser.add_argument(
        "--family",
        default="auto",
        choices=["auto", *FAMILIES],
        help="model family whose keep-in-high-precision rules apply (default: guessed from the keys)",
    )
    parser.add_argument(
        "--granularity",
        default="row",
        choices=["row", "tensor", "block"],
        help="scale granularity (default row)",
    )
    parser.add_argument("--block-size", type=int, help="input columns per scale, with --granularity block")
    parser.add_argument(
        "--convrot", action="store_true", help="Hadamard-rotate groups of input columns first"
    )
    parser.add_argument(
        "--convrot-group",
        type=int,
        default=DEFAULT_CONVROT_GROUP,
        help=f"rotation group size, a power of 4 (default {DEFAULT_CONVROT_GROUP}), with --convrot",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run_quantize(args: argparse.Namespace, console: Console) -> int:
    """Run ``leanvideo quantize`` for parsed ``args``; returns the exit code."""
    from leanvideo.int8.convert import quantize_file
    from leanvideo.int8.files import read_header
    from leanvideo.int8.policy import guess_family
    from leanvideo.int8.spec import Int8FormatError, Int8WeightConfig
    from leanvideo.int8.target import TargetFolderError, check_target

    from runner.fixtures import STAMP_KEY as FIXTURE_STAMP

    if args.output.suffix.lower() not in OUT_SUFFIXES and not args.output.is_dir():  # a folder: said below
        raise UsageError(
            f"OUT {args.output}: name it .safetensors (ComfyUI's model lists and the INT8 loaders go by "
            f"the suffix), e.g. {args.output.with_suffix('.safetensors')}"
        )
    if args.granularity == "block" and args.block_size is None:
        raise UsageError("--granularity block needs --block-size N (input columns per scale, e.g. 64)")
    if args.block_size is not None and args.granularity != "block":
        raise UsageError(
            f"--block-size {args.block_size} goes with --granularity block, not {args.granularity}"
        )
    if args.convrot_group != DEFAULT_CONVROT_GROUP and not args.convrot:
        raise UsageError(f"--convrot-group {args.convrot_group} goes with --convrot")
    try:  # said before IN is read, and as an unusable argument (exit 2), as `workflow convert --out` is
        check_target(args.output)
    except OSError as error:
        raise UsageError(f"OUT {error}") from error
    try:
        config = Int8WeightConfig(
            granularity=args.granularity,
            block_size=args.block_size,
            convrot=args.convrot,
            convrot_group=args.convrot_group,
        )
    except ValueError as error:
        raise UsageError(str(error)) from error
    try:
        family = args.family
        if family == "auto":
            family = guess_family(read_header(args.input).shapes, source=str(args.input))
        with Progress(
            TextColumn("quantizing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=args.json or not console.is_terminal,  # off a terminal it only leaves a blank line
        ) as progress:
            task = progress.add_task("tensors", total=None)

            def advance(key: str, done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            report = quantize_file(
                args.input,
                args.output,
                family=family,
                config=config,
                progress=advance,
                drop_metadata=(FIXTURE_STAMP,),  # the user's file is no fixture `fixtures` may rewrite
            )
    except TargetFolderError as error:  # an OUT whose folder takes no file: an unusable argument
        raise UsageError(f"OUT {error}; nothing was written") from error
    except OSError as error:
        if error.filename is None and error.strerror:  # a read or write that names no file
            raise LeanVideoError(
                f"{error.strerror} while quantizing {args.input} into {args.output} (nothing is left behind)"
            ) from error
        raise LeanVideoError(str(error)) from error
    except (Int8FormatError, ValueError) as error:
        raise LeanVideoError(str(error)) from error
    if args.json:
        print_json(console, report_json(report, family))
    else:
        _render(report, family, console)
        for line in fallback_lines(report, config) + _removed_lines(report):
            console.print(f"[yellow]note:[/] {escape(line)}", highlight=False, markup=True)
    return 0


def fallback_lines(report: QuantizeReport, config: Int8WeightConfig) -> list[str]:
    """What was asked but not done, per reason: layers whose input width the block size or the
    rotation group does not divide keep per-row scales or stay unrotated."""
    configs = report.layer_configs.values()
    lines = []
    if config.granularity == "block" and (rows := sum(c.granularity != "block" for c in configs)):
        lines.append(
            f"{rows} of {len(configs)} layers have per-row scales: --block-size {config.block_size} does not "
            "divide their input width"
        )
    if config.convrot and (plain := sum(not c.convrot for c in configs)):
        lines.append(
            f"{plain} of {len(configs)} layers are not rotated: --convrot-group {config.convrot_group} does "
            "not divide their input width"
        )
    return lines


def _removed_lines(report: QuantizeReport) -> list[str]:
    return [
        f"removed {path}, which a quantize of {report.target.name} killed before it ended had left"
        for path in report.removed_partials
    ]


def report_json(report: QuantizeReport, family: str) -> dict[str, Any]:
    from leanvideo.int8.spec import FORMAT_VERSION

    values = list(report.layer_sqnr_db.values())
    return {
        "source": str(report.source),
        "target": str(report.target),
        "family": family,
        "format_version": FORMAT_VERSION,
        "source_bytes": report.source_bytes,
        "target_bytes": report.target_bytes,
        "size_ratio": report.size_ratio,
        "verified": report.verified,
        "fp8_tensors": report.fp8_tensors,  # the SQNR of those is against their exact dequantized values
        "fp8_rotated_layers": report.rotated_layers,  # fp8 layers rotated because it cut their error
        "removed_partials": [str(path) for path in report.removed_partials],  # killed writers' files
        "layers": len(values),
        "layouts": dict(Counter(c.granularity for c in report.layer_configs.values())),
        "rotated": sum(c.convrot for c in report.layer_configs.values()),
        "exact_layers": sum(1 for value in values if math.isinf(value)),  # INT8 equals the source
        "sqnr_db": {  # null: an exact layer (infinite SQNR, which JSON cannot spell)
            "min": _json_db(min(values)),
            "median": _json_db(statistics.median(values)),
            "max": _json_db(max(values)),
            "per_layer": {layer: _json_db(value) for layer, value in report.layer_sqnr_db.items()},
        },
    }


def _json_db(value: float) -> float | None:
    return None if math.isinf(value) else value


def _db_text(value: float) -> str:
    return "exact" if math.isinf(value) else f"{value:.1f} dB"


def _render(report: QuantizeReport, family: str, console: Console) -> None:
    values = report.layer_sqnr_db
    layers = f"{len(values)} INT8 layer{'s' if len(values) != 1 else ''}"
    console.print(
        f"wrote {escape(str(report.target))} ({family}, {layers}, round trip verified): "
        f"{report.target_bytes / 1e6:.1f} MB / {report.source_bytes / 1e6:.1f} MB = "
        f"[bold]{report.size_ratio:.3f}×[/]",
        highlight=False,
        markup=True,
    )
    sqnr = list(values.values())
    reference = (
        f" (against the exact weights of the {report.fp8_tensors} fp8 tensors, scales applied)"
        if report.fp8_tensors
        else ""
    )
    console.print(
        f"per-layer SQNR: min {_db_text(min(sqnr))}, median {_db_text(statistics.median(sqnr))}, "
        f"max {_db_text(max(sqnr))}{reference}",
        highlight=False,
    )
    if report.fp8_tensors:
        from leanvideo.int8.fp8 import ROTATION_MIN_GAIN_DB

        console.print(
            f"fp8 source: scales follow the fp8 grid; {len(report.rotated_layers)} layers Hadamard-rotated "
            f"where that cut their error by {ROTATION_MIN_GAIN_DB:g} dB or more",
            highlight=False,
        )
    shown = min(WORST_LAYERS_SHOWN, len(values))
    table = Table(title=f"lowest SQNR ({shown} layer{'s' if shown != 1 else ''})")
    table.add_column("layer")
    table.add_column("SQNR dB", justify="right")
    for layer, value in sorted(values.items(), key=lambda item: item[1])[:WORST_LAYERS_SHOWN]:
        table.add_row(layer, "exact" if math.isinf(value) else f"{value:.1f}")
    console.print(table)
