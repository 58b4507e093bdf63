"""``leanvideo kernels [PATH ...] [--json] [--clear]``: the INT8 kernel choices servers measured."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from runner.cli.render import print_json
from runner.errors import WorkspaceError
from runner.local.workspace import Workspace, find_workspace

if TYPE_CHECKING:
    from runner.jobs.kernel_tables import KernelTable


def add_kernels_parser(sub: Any) -> None:
    """Add ``kernels`` to ``sub`` (from ``add_subparsers``)."""
    kernels = sub.add_parser(
        "kernels",
        help="the INT8 kernel each layer shape runs on (path=auto measures them), per device",
        epilog="exit codes: 0 shown or cleared (also when no server measured yet), 1 a PATH is missing or "
        "not a table, 3 not installed",
    )
    kernels.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="table files or folders to search (default: the workspace's servers, the demo's included)",
    )
    kernels.add_argument("--json", action="store_true", help="print the tables as JSON")
    kernels.add_argument(
        "--clear",
        action="store_true",
        help="delete the tables, a damaged int8_kernels.json too (nothing when a named file is no table): "
        "the next load measures again; with --json, the removed files as a JSON list",
    )


def run_kernels_command(args: argparse.Namespace, console: Console) -> int:
    """Show (or clear) the tables; errors propagate as runner.errors."""
    # Imported here: the table's fingerprint needs torch, which the rest of the CLI imports only on use.
    from runner.jobs.kernel_tables import clear_tables, find_tables, read_tables

    workspace = find_workspace() if not args.paths else _workspace_if_any()
    servers = workspace.servers_dir if workspace is not None else None
    yours = workspace.comfyui_dir / "user" if workspace and workspace.user_comfyui else None
    places = args.paths or [  # the servers leanvideo started, and your own ComfyUI started by you
        place for place in (servers, yours) if place is not None and place.is_dir()
    ]
    paths = find_tables(places)
    if args.clear:
        removed = clear_tables(paths)
        if args.json:
            print_json(console, [str(path) for path in removed])
            return 0
        for path in removed:
            console.print(f"removed {path}", highlight=False)
        if not paths:
            console.print("no INT8 kernel table to remove", highlight=False)
        return 0
    tables = read_tables(paths)
    if args.json:
        print_json(console, [table.to_json() for table in tables])
        return 0
    if not tables:
        where = ", ".join(str(place) for place in places) or str(servers)
        console.print(
            f"no INT8 kernel table under {where}: path=auto measures at first use"
            + ("" if args.paths else " (a bench's servers keep theirs in its --out: leanvideo kernels OUT)"),
            highlight=False,
        )
    for table in tables:
        # your ComfyUI started by you runs its own Python, whose versions this one cannot judge
        theirs = yours is not None and table.path.is_relative_to(yours.resolve())
        for view in _tables(table, theirs=theirs):
            console.print(view)
    return 0


def _workspace_if_any() -> Workspace | None:
    """The installed workspace, or None: tables named by path are read without one."""
    try:
        return find_workspace()
    except WorkspaceError:
        return None


def _tables(table: KernelTable, *, theirs: bool = False) -> list[Table]:
    """One view per device in ``table``: each shape class, its kernel, and the others' time vs w8a16;
    below it, each reason a kernel was ruled out, with the kernels and, unless it held for every shape,
    the shapes (weight/≤rows) where it did. ``theirs``: written by the user's own ComfyUI, under its
    own Python, not the one judging it here."""
    versions = (
        f"torch {table.fingerprint.get('torch')}, comfy-kitchen {table.fingerprint.get('comfy_kitchen')}"
    )
    differs = escape("; ".join(table.stale_because()) or "other versions")
    state = (
        "in use"
        if table.current
        else f"[yellow]made under other versions than LeanVideo's Python has ({differs}): in use by your "
        "ComfyUI's own Python if it has them (the servers leanvideo starts keep tables of their own)[/]"
        if theirs
        else f"[yellow]stale ({differs}): measured again at next use[/]"
    )
    views = []
    for device in sorted({row.shape.device for row in table.rows}):
        title = f"{escape(str(table.path))} ({escape(versions)}, {state})\n{escape(device)}"
        rows = [r for r in table.rows if r.shape.device == device]
        caption = _ruled_out(rows)
        view = Table(
            title=Text.from_markup(title),
            title_justify="left",
            caption=caption or None,
            caption_justify="left",
        )
        for column in ("weight", "rows ≤", "layout", "kernel", "time vs w8a16"):
            view.add_column(column)
        for row in sorted(rows, key=lambda r: (r.shape.dtype, r.shape.weight_shape, r.shape.rows)):
            others = {k: v for k, v in row.choice.ratios().items() if k != "w8a16"}
            ratios = "  ".join(f"{name} {value:.2f}×" for name, value in others.items())
            kernel = row.choice.kernel + (
                "" if row.choice.source == "measured" else f" ({row.choice.source})"
            )
            shape = row.shape
            weight = f"{shape.weight_shape} {shape.dtype}"
            view.add_row(weight, str(shape.rows), shape.layout, kernel, ratios or "—")
        views.append(view)
    return views


def _ruled_out(rows: list[Any]) -> str:
    """Each reason a kernel was ruled out, once per set of shapes it held for, with the kernels it ruled
    out there; the shapes (weight/≤rows, and dtype and layout where the rows differ in them) are named
    unless it held for every row."""
    dtypes, layouts = {r.shape.dtype for r in rows}, {r.shape.layout for r in rows}

    def label(row: Any) -> str:
        extra = [row.shape.dtype] * (len(dtypes) > 1) + [row.shape.layout] * (len(layouts) > 1)
        return " ".join([f"{row.shape.weight_shape}/≤{row.shape.rows}", *extra])

    where: dict[tuple[str, str], list[str]] = {}  # (reason, kernel) -> a label per row
    for row in sorted(rows, key=lambda r: (r.shape.weight_shape, r.shape.rows, r.shape.dtype)):
        for kernel, why in row.choice.shared_reasons().items():  # one wording for kernels ruled out alike
            where.setdefault((why, kernel), []).append(label(row))
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (why, kernel), shapes in where.items():
        every = len(shapes) == len(rows)
        grouped.setdefault((why, () if every else tuple(dict.fromkeys(shapes))), []).append(kernel)
    return "\n".join(
        f"{', '.join(sorted(kernels))}: {why}" + (f" (on {', '.join(shapes)})" if shapes else "")
        for (why, shapes), kernels in grouped.items()
    )
