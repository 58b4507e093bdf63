"""What happened to one prompt, and the readable messages for rejections and failures.

Example::

    result = run_prompt(client, workflow)
    print(result.status, result.wall_seconds, result.server_seconds, result.phases)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runner.tracking.events import NodeTiming, PromptTracker, exception_name, phase_seconds


@dataclass
class PromptResult:
    """What happened to one submitted prompt (also when it failed, timed out or was cancelled)."""

    prompt_id: str
    status: str
    submitted_at: float
    started_at: float | None
    finished_at: float
    nodes: list[NodeTiming] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    server_seconds: float | None = None
    reconnects: int = 0
    retries: int = 0  # HTTP requests repeated after a cut (the client's count when the record was written)
    partial: bool = False

    @property
    def wall_seconds(self) -> float:
        """End to end, as the client sees it: submit → history entry read."""
        return self.finished_at - self.submitted_at

    @property
    def queue_seconds(self) -> float:
        """Submit → execution start; a prompt that never started waited its whole time. The start is when
        the client heard of it, which is late on a busy machine (the socket delivers the event after the
        server sent it), never early: it is taken no later than the server's own execution window allows
        (``finished_at − server_seconds``), so that queue and execution never add up to more than the
        wall time."""
        if self.started_at is None:
            return self.finished_at - self.submitted_at
        started = self.started_at
        if self.server_seconds is not None:
            started = min(started, self.finished_at - self.server_seconds)
        return max(0.0, started - self.submitted_at)

    @property
    def overhead_seconds(self) -> float | None:
        """Client wall time not spent inside the server's execution window (HTTP, socket, polling)."""
        return None if self.server_seconds is None else self.wall_seconds - self.server_seconds

    @property
    def phases(self) -> dict[str, float]:
        return phase_seconds(self.nodes)


def result_from_tracker(
    tracker: PromptTracker, wall_start: float, submitted: float, entry: dict[str, Any] | None, reconnects: int
) -> PromptResult:
    """The result as known now; ``wall_start``/``submitted`` are the submit time (wall, monotonic)."""
    finished = time.monotonic()
    outputs = entry.get("outputs", {}) if entry is not None else tracker.ui_outputs
    return PromptResult(
        prompt_id=tracker.prompt_id,
        status=tracker.status,
        submitted_at=wall_start,
        started_at=wall_start + (tracker.started_at - submitted) if tracker.started_at else None,
        finished_at=wall_start + (finished - submitted),
        nodes=[*tracker.timings, *filter(None, [tracker.running_timing(finished)])],  # one cut short too
        outputs=tracker.with_latest_reports(outputs or {}),
        error=tracker.error,
        server_seconds=tracker.server_seconds,
        reconnects=reconnects,
    )


def output_files(outputs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every file entry in a history ``outputs`` mapping, as ``(node_id, entry)`` pairs."""
    found: list[tuple[str, dict[str, Any]]] = []
    for node_id, output in outputs.items():
        for value in output.values():
            if isinstance(value, list):
                found += [(node_id, v) for v in value if isinstance(v, dict) and "filename" in v]
    return found


def describe_failure(result: PromptResult) -> str:
    """One readable message for a failed or interrupted prompt."""
    if result.status == "interrupted":
        where = (result.error or {}).get("message", "").removeprefix("interrupted")
        return f"prompt {result.prompt_id} was interrupted{where}"
    error = result.error or {}
    kind = exception_name(error.get("exception_type")) or ""
    return (
        f"prompt {result.prompt_id} failed in node {error.get('node_id', '?')} "
        f"({error.get('class_type', '?')}): {kind}: {error.get('message', '')}"
    )
