"""``leanvideo workflow validate|diff|convert``: workflow files checked, compared and converted."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from runner.cli.render import print_json, problems_table
from runner.cli.server_options import (
    add_server_arguments,
    given_path,
    override_spec,
    positive_seconds,
    run_options,
)
from runner.errors import UsageError, WorkflowError
from runner.graph.convert import CutLinks, as_api_workflow, check_workflow_document
from runner.graph.diff import diff_workflows, summarize
from runner.graph.editor_nodes import editor_only_hints
from runner.graph.subgraph import flatten_subgraphs
from runner.graph.validate import validate_workflow
from runner.graph.workflow import api_workflow, apply_overrides, is_ui_workflow
from runner.graph.workflow_file import read_json_file
from runner.jobs.run import collect_environment
from runner.transport.client import ComfyClient

# A workflow check asks the server a few quick questions: a server that takes the connection and never
# answers is given up after this, retries included (a run's --timeout covers a whole prompt instead)
DEFAULT_TIMEOUT_S = 60.0


def add_workflow_parser(sub: Any) -> None:
    """Add the ``workflow`` command and its actions to ``sub`` (from ``add_subparsers``)."""
    workflow = sub.add_parser("workflow", help="validate, convert or compare workflow files")
    workflow_sub = workflow.add_subparsers(dest="workflow_command", required=True, metavar="ACTION")
    validate = workflow_sub.add_parser(
        "validate",
        help="check a workflow against /object_info: unknown nodes, bad or missing inputs, missing models",
        epilog="exit codes: 0 valid (warnings allowed), 2 usage (a --server that is no URL), 4 server "
        "unreachable or silent past --timeout, 5 invalid",
    )
    validate.add_argument(
        "file",
        type=Path,
        help="workflow JSON (API format, or an editor file: converted first), a PNG ComfyUI saved, or -",
    )
    add_server_arguments(validate)
    _add_timeout(validate)
    validate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        type=override_spec,
        default=[],
        metavar="NODE.input=VALUE",
        help="change an input first, as `leanvideo run --set` does",
    )
    validate.add_argument("--json", action="store_true", help="print the findings as JSON")
    diff = workflow_sub.add_parser(
        "diff",
        help="semantic differences between two workflows: nodes, inputs, links (not a text diff)",
        epilog="exit codes: 0 same, 1 different, 2 usage, 4 server unreachable or silent past --timeout "
        "(UI files only), 5 unreadable file. "
        "Editor (UI) files are converted to API format with the server's /object_info first.",
    )
    diff.add_argument("a", type=Path, help="the old workflow (API or UI format, a PNG ComfyUI saved, or -)")
    diff.add_argument("b", type=Path, help="the new workflow (API or UI format, a PNG ComfyUI saved, or -)")
    add_server_arguments(diff)
    _add_timeout(diff)
    diff.add_argument("--json", action="store_true", help="print the changes as JSON")
    convert = workflow_sub.add_parser(
        "convert",
        help="convert an editor (UI) workflow to API format using the server's /object_info",
        epilog="exit codes: 0 converted, 2 --out exists or is unusable, 4 server unreachable or silent "
        "past --timeout, "
        "5 not convertible (unknown nodes, legacy group nodes, not a UI file)",
    )
    convert.add_argument(
        "file", type=Path, help="UI workflow JSON (as saved by the ComfyUI editor), a PNG ComfyUI saved, or -"
    )
    add_server_arguments(convert)
    _add_timeout(convert)
    convert.add_argument(
        "--out", type=given_path, help="write the API JSON here (never overwritten; default stdout)"
    )


def _add_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds to wait for the server's answers, retries included (default {DEFAULT_TIMEOUT_S:g})",
    )


def _server_client(args: argparse.Namespace, deadline: float | None = None) -> ComfyClient:
    """A client for the command's server that gives up at ``deadline`` (``time.monotonic()``; default
    ``--timeout`` from now)."""
    options = run_options(args, timeout=args.timeout)
    return options.make_client(deadline=deadline or time.monotonic() + args.timeout)


def run_workflow_command(args: argparse.Namespace, console: Console) -> int:
    if args.workflow_command == "diff":
        return cmd_workflow_diff(args, console)
    if args.workflow_command == "convert":
        return cmd_workflow_convert(args, console)
    return cmd_workflow_validate(args, console)


def cmd_workflow_validate(args: argparse.Namespace, console: Console) -> int:
    run_options(args)  # a bad --server, --token or --header is said before the file is read
    document = read_json_file(args.file)  # a missing or broken file is said before the server is asked
    check_workflow_document(document, args.file)
    with _server_client(args) as client:
        object_info = client.get_json("/object_info")
        environment = collect_environment(client)
    # an editor (UI) file is checked as the API workflow it converts to (conversion problems are errors)
    cut: CutLinks = {}
    workflow = as_api_workflow(document, args.file, object_info, cut)
    hints = editor_only_hints(document) if args.overrides and is_ui_workflow(document) else None
    apply_overrides(workflow, list(args.overrides), object_info, hints)
    problems = validate_workflow(workflow, object_info, cut)
    errors = [p for p in problems if p.kind == "error"]
    if args.json:
        found = [
            {
                "kind": p.kind,
                "node_id": p.node_id,
                "class_type": p.class_type,
                "input": p.input_name,
                "message": p.message,
            }
            for p in problems
        ]
        print_json(console, {"file": str(args.file), "valid": not errors, "problems": found})
    elif problems:
        console.print(
            problems_table(problems, f"{args.file} against ComfyUI {environment['comfyui_version']}")
        )
    if not args.json:
        verdict = f"{len(errors)} error(s), {len(problems) - len(errors)} warning(s)"
        console.print(f"{args.file}: {'invalid' if errors else 'valid'} ({verdict})", highlight=False)
    return 5 if errors else 0


def cmd_workflow_diff(args: argparse.Namespace, console: Console) -> int:
    deadline = time.monotonic() + args.timeout  # one --timeout for the command, two files or one
    if str(args.a) == str(args.b) == "-":
        raise UsageError("A and B are both - (standard input): it can be one of them")
    (a, a_modes), (b, b_modes) = (_load_any_workflow(path, args, deadline) for path in (args.a, args.b))
    changes = diff_workflows(a, b, (a_modes, b_modes))  # muted and bypassed nodes said so
    if args.json:
        found = [change.to_json() for change in changes]
        print_json(console, {"a": str(args.a), "b": str(args.b), "changes": found})
    elif changes:
        for change in changes:
            console.print(str(change), highlight=False, markup=False)
        counts = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in summarize(changes).items())
        console.print(f"{len(changes)} change(s): {counts}", highlight=False)
    else:
        console.print(f"{args.a} and {args.b} are the same workflow", highlight=False)
    return 1 if changes else 0


def _load_any_workflow(
    path: Path, args: argparse.Namespace, deadline: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An API-format workflow from ``path`` and, for an editor (UI) file, converted with the server's
    help, ``{node id: (type, mode)}`` of its nodes (a muted one is not in the conversion)."""
    document = read_json_file(path)
    check_workflow_document(document, path)  # a damaged file is said before the server is asked
    if not is_ui_workflow(document):
        return api_workflow(document, path), {}  # no server needed
    with _server_client(args, deadline) as client:
        api = as_api_workflow(document, path, client.get_json("/object_info"))
    nodes = flatten_subgraphs(document)[0]
    return api, {str(node.get("id")): (str(node.get("type")), node.get("mode")) for node in nodes}


def cmd_workflow_convert(args: argparse.Namespace, console: Console) -> int:
    ui = read_json_file(args.file, png_keys=("workflow", "prompt"))  # of a PNG, the editor's graph first
    if not is_ui_workflow(ui):
        if isinstance(ui, dict) and isinstance(ui.get("prompt"), dict):
            api_workflow(ui, args.file)  # a /prompt request body: said so
        already = "it is already in API format" if isinstance(ui, dict) and ui else "it has no 'nodes' list"
        raise WorkflowError(f"{args.file} is not an editor (UI) workflow: {already}")
    check_workflow_document(ui, args.file)  # a damaged file is said before the server is asked
    if args.out is not None and not args.out.parent.is_dir():
        state = "is a file, not a folder" if args.out.parent.exists() else "does not exist"
        raise UsageError(f"--out {args.out}: the folder {args.out.parent} {state}")
    with _server_client(args) as client:
        api = as_api_workflow(ui, args.file, client.get_json("/object_info"))
    text = json.dumps(api, indent=2, ensure_ascii=False) + "\n"  # as the editor's Export (API): readable
    if args.out is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))  # UTF-8 whatever the terminal's encoding
        sys.stdout.buffer.flush()
        return 0
    try:
        with args.out.open("x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError as exc:
        raise UsageError(f"--out {args.out} already exists; refusing to overwrite it") from exc
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write it ({exc.strerror or exc})") from exc
    console.print(f"wrote {args.out} ({len(api)} nodes)", highlight=False)
    return 0
