"""``leanvideo models check WORKFLOW``: the model files a workflow needs, present or where to get them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from runner.cli.render import print_json
from runner.cli.server_options import existing_folder
from runner.jobs.models import ModelsReport, check_models
from runner.local.extra_model_paths import ExtraModelPaths, comfyui_extra_model_paths
from runner.local.workspace import find_workspace


def add_models_parser(sub: Any) -> None:
    """Add ``models check`` to ``sub`` (from ``add_subparsers``)."""
    models = sub.add_parser("models", help="model files a workflow needs")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    check = models_sub.add_parser(
        "check",
        help="list every model file a workflow loads: present (size) or missing (URL and folder)",
        epilog="exit codes: 0 every file present, 1 something missing or invalid (also when the workspace "
        "has no models folder yet), 2 --models is no folder or the ComfyUI's extra_model_paths.yaml "
        "cannot be read, 3 not installed, 5 bad workflow",
    )
    check.add_argument(
        "workflow", type=Path, help="workflow JSON (API or editor format), a PNG ComfyUI saved, or -"
    )
    check.add_argument(
        "--models",
        type=existing_folder,
        default=None,
        help="models folder (default: the workspace's; with install.py --comfyui, that ComfyUI's models "
        "folder and the folders of its extra_model_paths.yaml, in the order it searches them, then the "
        "workspace's)",
    )
    check.add_argument("--sha256", action="store_true", help="also hash every present file")
    check.add_argument("--json", action="store_true", help="print the report as JSON")


def run_models_command(args: argparse.Namespace, console: Console) -> int:
    """Run ``leanvideo models check``; returns the exit code (errors propagate as runner.errors)."""
    also: tuple[Path, ...] = ()
    extra = ExtraModelPaths()
    if args.models:
        models_dir = fixtures_dir = args.models
    else:  # with the user's own ComfyUI, its models folder first: the workspace's holds the tiny models
        workspace = find_workspace()
        models_dir, fixtures_dir = workspace.user_models_dir or workspace.models_dir, workspace.models_dir
        also = (workspace.models_dir,) if workspace.user_models_dir and workspace.models_dir.is_dir() else ()
        extra = comfyui_extra_model_paths(workspace.comfyui_dir)  # the servers' ComfyUI reads it at start
    report = check_models(
        args.workflow, models_dir, also=also, hashes=args.sha256, fixtures_dir=fixtures_dir, extra=extra
    )
    report.extra_paths = str(extra.file) if extra.file else None
    if args.json:
        print_json(console, report.to_json())
    else:
        for line in report_lines(report):
            console.print(line, highlight=False, markup=True)  # every line escapes what it quotes
    return 1 if report.missing else 0


def report_lines(report: ModelsReport) -> list[str]:
    """One line per file (two for a missing one: where to get it), then the count of missing files."""
    where = " and ".join(escape(folder) for folder in (report.models_dir, *report.also))
    if report.extra_paths:
        where += f" (and the folders {escape(report.extra_paths)} adds)"
    lines = [f"models of {escape(report.workflow)} in {where}:"]
    for file in report.files:
        where = f"{file.folder}/{file.name}" if file.folder else file.name
        node = f"node {file.node_id} ({file.class_type}.{file.input_name})"
        if file.status == "present":
            size = f"{(file.bytes or 0) / 2**20:.1f} MiB" + (f", sha256 {file.sha256}" if file.sha256 else "")
            found = f"  at {escape(file.path or '?')}" if report.also or report.extra_paths else ""  # where
            lines.append(f"  [green]present[/] {escape(where)}  {size}  {escape(node)}{found}")
        elif file.status in ("unchecked", "invalid"):
            colour = "yellow" if file.status == "unchecked" else "red"
            at = f" {escape(file.path)}" if file.path else ""  # a damaged file: which one
            lines.append(f"  [{colour}]{file.status}[/]{at} {escape(node)}: {escape(file.hint or '')}")
            if file.url:
                cited = f" (cited in {escape(file.cited_in)})" if file.cited_in else ""
                lines.append(f"          get it again from {escape(file.url)}{cited}")
        else:
            lines.append(f"  [red]missing[/] {escape(where)}  {escape(node)}")
            if file.hint:
                lines.append(f"          {escape(file.hint)}")
            cited = f" (cited in {escape(file.cited_in)})" if file.cited_in else ""
            # a loader of a custom node LeanVideo does not know: only that node knows its folder
            unknown = f"the folder {file.class_type} reads (see that node's documentation)"
            target = escape(file.target or unknown)
            if file.url:
                lines.append(f"          get it from {escape(file.url)}{cited} into {target}")
            else:
                lines.append(f"          no known download URL; it goes in {target}")
    count, files = report.missing, sum(1 for file in report.files if file.status == "present")
    unchecked = sum(1 for file in report.files if file.status == "unchecked")
    lines.append(f"{count} file(s) missing or invalid" if count else f"all {files} file(s) present")
    if unchecked:
        lines[-1] += f"; {unchecked} chosen by a link, not checked"
    return lines
