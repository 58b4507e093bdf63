"""Rich rendering for ``leanvideo run`` and ``leanvideo workflow``: live progress and summary tables.

Only the CLI uses this module; the library itself never prints.

Example::

    with run_progress(console) as progress:  # bars on a terminal, plain lines off one
        outcome = run_workflow(path, options, on_event=progress.update)
    console.print(summary_table(outcome.record))
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from runner.errors import LeanVideoError, PromptCancelledError
from runner.graph.validate import Problem
from runner.tracking.events import ClientEvent, phase_of

# Figures of the node pack's per-prompt telemetry record shown in the summary.
TELEMETRY_ROWS = (
    ("peak RSS (server)", "peak_rss_bytes"),
    ("peak VRAM allocated", "cuda_max_allocated_bytes"),
    ("peak VRAM reserved", "cuda_max_reserved_bytes"),
    ("energy (Wh)", "energy_wh"),
)


class RunProgress:
    """Two bars fed by client events: nodes done (cached included; their count comes with the prompt's
    ``started`` event) and the running sampler's steps; :func:`run_progress` picks it on a terminal."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}", markup=False),  # node classes are the server's text
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._nodes: TaskID = self._progress.add_task("nodes: queued", total=None)
        self._steps: TaskID = self._progress.add_task("steps", total=None, visible=False)
        self._steps_node: str | None = None
        self._started = False
        self._ended: str | None = None  # how a failed or interrupted prompt ended

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._started:
            self._progress.stop()

    def update(self, event: ClientEvent) -> None:
        """Apply one :class:`~runner.tracking.events.ClientEvent` (pass this method as ``on_event``)."""
        if not self._started:  # shown from the first event on: nothing while validating and submitting
            self._started = True
            self._progress.start()
        if event.kind == "started" and event.value is not None:  # the submitted workflow's node count
            self._progress.update(self._nodes, total=event.value)
        elif event.kind == "cached":
            self._progress.advance(self._nodes)
        elif event.kind == "node":
            completed = self._progress.tasks[self._nodes].completed
            if self._progress.tasks[self._nodes].description != "nodes: queued":
                completed += 1
            self._progress.update(
                self._nodes,
                completed=completed,
                description=f"node {event.node_id} {event.class_type}",
            )
        elif event.kind == "step" and event.max:
            if event.node_id != self._steps_node:
                self._steps_node = event.node_id
                self._progress.reset(self._steps, total=event.max, visible=True)
            self._progress.update(
                self._steps, completed=event.value or 0, description=f"steps of node {event.node_id}"
            )
        elif event.kind in ("error", "interrupted"):
            self._ended = (
                f"nodes: {'failed' if event.kind == 'error' else 'interrupted'} at node {event.node_id}"
            )
            self._progress.update(self._nodes, description=self._ended)
        elif event.kind == "done":
            if self._ended is not None:  # the bar stays where the prompt stopped
                self._progress.update(self._nodes, description=self._ended)
                return
            total = self._progress.tasks[self._nodes].total
            self._progress.update(self._nodes, completed=total, description="nodes: done")


PLAIN_STEP_EVERY_S = 10.0


def run_progress(console: Console) -> RunProgress | PlainRunProgress:
    """The live progress of a prompt on ``console``: bars on a terminal; off one (a CI log, a file),
    where bars would only show once the prompt ended, plain lines as it goes."""
    return RunProgress(console) if console.is_terminal else PlainRunProgress(console)


class PlainRunProgress:
    """:class:`RunProgress` as plain lines: each node as it starts, the steps at most every
    :data:`PLAIN_STEP_EVERY_S` seconds (and the last one), and how the prompt ended."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._total: int | None = None
        self._done = 0
        self._node: str | None = None
        self._last_steps = 0.0
        self._ended = False

    def __enter__(self) -> PlainRunProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        return None

    def _say(self, text: str) -> None:
        self._console.print(text, highlight=False, markup=False)

    def update(self, event: ClientEvent) -> None:
        """Apply one :class:`~runner.tracking.events.ClientEvent` (pass this method as ``on_event``)."""
        if event.kind == "started":
            self._total = event.value
            self._say("prompt started" + (f" ({event.value} nodes)" if event.value is not None else ""))
        elif event.kind == "cached":
            self._done += 1
        elif event.kind == "node":
            self._done += self._node is not None
            self._node = event.node_id
            self._say(f"node {event.node_id} {event.class_type} ({self._done + 1}/{self._total or '?'})")
        elif event.kind == "step" and event.max:
            now = time.monotonic()
            if event.value == event.max or now - self._last_steps >= PLAIN_STEP_EVERY_S:
                self._last_steps = now
                self._say(f"  steps of node {event.node_id}: {event.value or 0}/{event.max}")
        elif event.kind in ("error", "interrupted"):
            self._ended = True
            what = "failed" if event.kind == "error" else "interrupted"
            self._say(f"prompt {what} at node {event.node_id}")
        elif event.kind == "done" and not self._ended:
            self._say(f"nodes: done ({self._total}/{self._total})" if self._total else "nodes: done")


class PipeConsole(Console):
    """rich's console, except that a reader of its stream going away (``| head``) raises
    ``BrokenPipeError`` for the command to end as SIGPIPE would (exit 141): rich's own handling exits 1,
    which says a command failed."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written to the stream
        raise BrokenPipeError


def broken_pipe_exit() -> int:
    """The exit code after stdout's reader went away (``| head``): SIGPIPE's, as a shell says it; stdout
    is pointed at /dev/null first, so that flushing it at exit raises no second error."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def print_json(console: Console, document: Any) -> None:
    """``document`` (an object, or JSON text) on ``console``'s stream as plain indented JSON: never
    coloured, whatever the terminal (a pty, ``FORCE_COLOR``) — ``--json`` output is read by programs."""
    data = json.loads(document) if isinstance(document, str) else document
    encoding = (getattr(console.file, "encoding", None) or "utf-8").lower().replace("_", "-")
    # \u escapes where the stream cannot carry every character (LANG=C, PYTHONIOENCODING=ascii)
    unicode_safe = encoding in ("utf-8", "utf8", "utf-16", "utf-32")
    console.file.write(json.dumps(data, indent=2, ensure_ascii=not unicode_safe) + "\n")
    console.file.flush()


INTERRUPTED = PromptCancelledError.exit_code  # 130: a command stopped by Ctrl-C, SIGTERM or SIGHUP


def print_json_error(console: Console, kind: str, message: str, exit_code: int) -> None:
    """The ``{"error": {type, message, exit_code}}`` document a ``--json`` command ends with when it fails
    or is interrupted (README "Exit codes")."""
    print_json(console, {"error": {"type": kind, "message": message, "exit_code": exit_code}})


def error_type(error: LeanVideoError) -> str:
    """The ``type`` of the ``{"error": …}`` document for ``error``: a prompt cancelled by Ctrl-C or
    SIGTERM is said as any interrupted command is, ``KeyboardInterrupt``."""
    return "KeyboardInterrupt" if isinstance(error, PromptCancelledError) else type(error).__name__


def failure_label(error: LeanVideoError) -> str:
    """How an error that ends a command is introduced: Ctrl-C (a cancelled prompt) is the user's doing,
    said as what happened to the prompt, not as an error."""
    return "[yellow]interrupted:[/]" if isinstance(error, PromptCancelledError) else "[bold red]error:[/]"


def summary_table(record: dict[str, Any]) -> Group:
    """Per-node times (with per-step times of samplers), phases and totals of one run record."""
    nodes = Table(title=f"prompt {record['prompt_id']}: {record['status']}")
    # s/step: the median step, as the bench gives it (the first step also holds the sampler's set-up)
    for column in ("node", "class", "phase", "seconds", "steps", "s/step (median)"):
        nodes.add_column(column, justify="left" if column in {"node", "class", "phase"} else "right")
    for node in record["nodes"]:
        steps = node.get("step_seconds") or []
        per_step = f"{statistics.median(steps):.4f}" if steps else ""
        seconds = "cached" if node["cached"] else f"{node['seconds']:.3f}"
        phase = phase_of(node["class_type"])
        nodes.add_row(node["node_id"], node["class_type"], phase, seconds, str(node["steps"] or ""), per_step)
    parts: list[Any] = [nodes]
    for node in record["nodes"]:
        if node.get("step_seconds"):
            times = " ".join(f"{s:.4f}" for s in node["step_seconds"])
            parts.append(f"step times of node {node['node_id']} (s; the first holds the set-up): {times}")
    timing = record["timing"]
    totals = Table(title="where the time went", show_header=False)
    totals.add_column("what")
    totals.add_column("seconds", justify="right")
    for phase, seconds in timing["phases"].items():
        if seconds:
            totals.add_row(f"phase: {phase}", f"{seconds:.3f}")
    totals.add_section()
    for label, key in (
        ("queue wait", "queue_s"),
        ("server execution window", "server_execution_s"),
        ("end to end (client)", "wall_s"),
        ("outside the server window", "overhead_s"),
    ):
        value = timing.get(key)
        totals.add_row(label, "—" if value is None else f"{value:.3f}")
    if timing.get("reconnects") or timing.get("retries"):
        reconnects, retries = timing.get("reconnects", 0), timing.get("retries", 0)
        cuts = f"{reconnects} websocket reconnect(s), {retries} HTTP retry(ies)"
        totals.add_row("the network cut it", cuts)
    telemetry = record.get("telemetry") or {}
    totals.add_section()
    if telemetry.get("available"):
        for label, key in TELEMETRY_ROWS:
            value = telemetry.get(key)
            if value is None:
                shown = "—"
            elif key.endswith("_bytes"):
                shown = f"{value / 2**20:.1f} MiB"
            else:
                shown = f"{value:.4g}"
            totals.add_row(label, shown)
        if telemetry.get("gpu_reason"):
            totals.add_row("GPU figures", str(telemetry["gpu_reason"]))
    else:
        totals.add_row("telemetry", str(telemetry.get("reason", "not available")))
    parts.append(totals)
    if record["outputs"]:
        files = Table(title="outputs")
        for column in ("node", "file", "bytes", "video", "sha256"):
            files.add_column(column, overflow="fold")  # a path is shown whole, folded, never cut
        for item in record["outputs"]:
            video = item.get("video") or {}
            described = (
                f"{video['frames']} frames {video['width']}×{video['height']} @ {video['fps']}"
                if video
                else ""
            )
            files.add_row(item["node_id"], item["path"], str(item["bytes"]), described, item["sha256"][:16])
        parts.append(files)
    return Group(*parts)


def problems_table(problems: list[Problem], title: str) -> Table:
    """Validation findings, one row each, naming node id, class and input."""
    table = Table(title=title)
    for column in ("level", "node", "class", "input", "problem"):
        table.add_column(column)
    for problem in problems:
        style = "red" if problem.kind == "error" else "yellow"
        table.add_row(
            Text(problem.kind, style=style),
            problem.node_id,
            problem.class_type,
            problem.input_name or "",
            problem.message,
        )
    return table
