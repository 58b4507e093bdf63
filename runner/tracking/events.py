"""Turn the websocket messages of one prompt into client events, node timings and step timings.

Server messages map to client events as follows (``executing{node: null}`` is the only completion
signal: ``execution_success`` arrives *before* the server writes history):

=============================  ==================  ====================================================
server message                 client event        bookkeeping
=============================  ==================  ====================================================
``execution_start{timestamp}``  ``started``         queue wait ends; server window opens (its timestamp);
                                                   the event's ``value``: the prompt's node count
``execution_cached{nodes}``    ``cached``          listed nodes recorded as cached (0 s)
``executing{node}``            ``node``            closes the previous node's timer, opens ``node``'s
``progress{value,max,node}``   ``step``            one sampler step of ``node`` done (time since last)
``executed{node,output}``      ``output``          keeps the node's UI output (replaced, never appended)
``execution_success``          ``success``         server window closes (its timestamp), and so does the
                                                   last node's timer, at that time on the client's clock
                                                   (late delivery is no node's time); not done yet
``execution_error``            ``error``           closes timers, keeps node id, class and message
``execution_interrupted``      ``interrupted``     closes timers, marks the run interrupted
``executing{node: null}``      ``done``            history is written: the prompt is finished
``leanvideo.report{token,      (none)              the node pack's report sent again after its node ran
text}``                                            (an INT8 loader's, as the sampler chooses kernels):
                                                   replaces the ``text`` of the output holding
                                                   ``token`` (the history keeps the first one)
(a second without a message)   ``waiting``         none: a handler may stop the prompt (queued, or in a
                                                   node that reports no progress) by raising
``status``, ``progress_state``  (none)              ignored: queue size / duplicate of ``progress``
anything else, binary, junk    (none)              ignored (logged at debug level)
=============================  ==================  ====================================================

Messages of other prompts are ignored. After a reconnect the server may send ``executing{node}``
without a prompt id (the node it is running for our client id): it is taken as ours. Messages lost
while the socket was down are recovered from the history entry's ``status.messages`` (which carry the
same server timestamps) by :meth:`PromptTracker.apply_history`.

Example::

    tracker = PromptTracker(prompt_id, workflow)
    for raw in socket_messages:
        for event in tracker.handle(json.loads(raw), time.monotonic()):
            print(event.kind, event.node_id)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

Workflow = dict[str, Any]

# Phase of a node, from its class name: the first rule whose fragment occurs in the name wins, so
# "SamplerSelect" (KSamplerSelect only picks a sampler) must come before "Sampler", which also covers
# KSampler, KSamplerAdvanced, SamplerCustom and SamplerCustomAdvanced; and "Loader" before "TextEncode"
# (LeanVideoTextEncoderLoaderINT8 loads a model, as CLIPLoader does).
PHASE_RULES: tuple[tuple[str, str], ...] = (
    ("Loader", "model_load"),
    ("TextEncode", "text_encode"),
    ("VAEDecode", "vae_decode"),
    ("VAEEncode", "vae_encode"),
    ("SamplerSelect", "other"),
    ("Sampler", "sampling"),
    ("Save", "save"),
    ("Preview", "save"),
)
# The node pack's report sent again after its node ran, and the UI output key holding its token
# (leanvideo.int8_kernels' REPORT_EVENT and REPORT_TOKEN)
REPORT_MESSAGE = "leanvideo.report"
REPORT_TOKEN = "leanvideo_report"
PHASES = ("model_load", "text_encode", "sampling", "vae_decode", "vae_encode", "save", "other")


def phase_of(class_type: str) -> str:
    """The phase a node class belongs to (``"sampling"`` for ``SamplerCustom``, …)."""
    for fragment, phase in PHASE_RULES:
        if fragment in class_type:
            return phase
    return "other"


def class_type_of(workflow: Workflow, node_id: str) -> str:
    """The class of ``node_id``, also for expansion ids (``406.0.0.428``) and subgraph ids (``54:73``)."""
    for candidate in (node_id, node_id.split(".")[0], node_id.split(":")[-1]):
        node = workflow.get(candidate)
        if isinstance(node, dict):
            return str(node.get("class_type", "?"))
    return "?"


@dataclass
class NodeTiming:
    """Wall time one node took, as seen from the event stream (0 s and ``cached`` when cached)."""

    node_id: str
    class_type: str
    seconds: float
    cached: bool = False
    steps: int | None = None
    step_seconds: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ClientEvent:
    """One thing that happened to the followed prompt; see the table in the module docstring."""

    kind: str
    node_id: str | None = None
    class_type: str | None = None
    value: int | None = None
    max: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptTracker:
    """Bookkeeping for one prompt: fed raw messages, it yields :class:`ClientEvent` and keeps timings."""

    prompt_id: str
    workflow: Workflow
    started_at: float | None = None
    server_start_ms: int | None = None
    server_end_ms: int | None = None
    status: str = "running"
    error: dict[str, Any] | None = None
    done: bool = False
    timings: list[NodeTiming] = field(default_factory=list)
    ui_outputs: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, list[str]] = field(default_factory=dict)  # token -> a report's latest text
    _current: str | None = None
    _current_since: float = 0.0
    _last_step_at: float = 0.0
    _steps: dict[str, int] = field(default_factory=dict)
    _step_seconds: dict[str, list[float]] = field(default_factory=dict)
    # client time minus server time, from execution_start (its delivery delay included, so never less
    # than the true offset): maps the server's end of the prompt onto the client's clock
    _clock_offset: float | None = None

    @property
    def current_node(self) -> str | None:
        return self._current

    def handle(self, message: object, now: float) -> list[ClientEvent]:
        """Apply one decoded websocket message; returns the client events it produced (often none)."""
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            logger.debug("ignoring a message that is not {type, data}: %.200r", message)
            return []
        kind = message["type"]
        data = message.get("data")
        if not isinstance(data, dict):
            return []
        prompt_id = data.get("prompt_id")
        if prompt_id is not None and prompt_id != self.prompt_id:
            return []
        if prompt_id is None and kind not in ("executing", REPORT_MESSAGE):  # those name no prompt
            return []
        try:
            return self._dispatch(kind, data, now)
        except (TypeError, ValueError, KeyError) as exc:
            logger.debug("ignoring malformed %s message (%s): %.200r", kind, exc, data)
            return []

    def _dispatch(self, kind: str, data: dict[str, Any], now: float) -> list[ClientEvent]:
        if kind == "execution_start":
            self.started_at = now
            self.server_start_ms = _timestamp(data)
            if self.server_start_ms is not None:
                self._clock_offset = now - self.server_start_ms / 1000
            return [ClientEvent("started", value=len(self.workflow), data=data)]
        if kind == "execution_cached":
            events = []
            known = {t.node_id for t in self.timings}
            for node_id in map(str, data.get("nodes") or []):
                if node_id not in known:
                    self.timings.append(NodeTiming(node_id, self.class_type(node_id), 0.0, cached=True))
                    events.append(ClientEvent("cached", node_id, self.class_type(node_id)))
            return events
        if kind == "executing":
            node = data.get("node")
            if node is None:
                if data.get("prompt_id") != self.prompt_id:
                    return []
                self._close_current(now)
                self.done = True
                if self.status == "running":
                    self.status = "success"
                return [ClientEvent("done")]
            node_id = str(node)
            if node_id == self._current or self.server_end_ms is not None:
                # the server repeats the running node after a reconnect; after the prompt ended, the
                # last one (ComfyUI sends it to a reconnecting client until the next prompt starts)
                return []
            self._close_current(now)
            self._current, self._current_since, self._last_step_at = node_id, now, now
            return [ClientEvent("node", node_id, self.class_type(node_id))]
        if kind == "progress":
            node_id = str(data["node"])
            value, maximum = int(data["value"]), int(data["max"])
            self._steps[node_id] = maximum
            self._step_seconds.setdefault(node_id, []).append(now - self._last_step_at)
            self._last_step_at = now
            return [ClientEvent("step", node_id, self.class_type(node_id), value, maximum)]
        if kind == "executed":
            node_id = str(data["node"])
            self.ui_outputs[node_id] = data.get("output")
            return [ClientEvent("output", node_id, self.class_type(node_id), data=data)]
        if kind == REPORT_MESSAGE and isinstance(data["token"], str) and isinstance(data["text"], list):
            self.reports[data["token"]] = data["text"]  # sent to this client only: one of ours
            return []
        if kind == "execution_success":
            self.server_end_ms = _timestamp(data)
            # The last node ended when the server says the prompt did: its messages can reach the
            # client a second or more later (seen 0.5–1.8 s), which is no time of that node's
            self._close_current(self._server_end_on_client_clock(now))
            return [ClientEvent("success")]
        if kind in ("execution_error", "execution_interrupted"):
            self.server_end_ms = _timestamp(data)
            self._close_current(self._server_end_on_client_clock(now))
            if kind == "execution_error":
                self.status, self.error = "error", error_summary(data)
            else:
                self.status, self.error = "interrupted", self._interruption(data)
            return [ClientEvent(kind.removeprefix("execution_"), data.get("node_id"), data.get("node_type"))]
        return []

    def class_type(self, node_id: str) -> str:
        return class_type_of(self.workflow, node_id)

    def with_latest_reports(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """``outputs`` (the history's, or the websocket's) with each report the node pack sent again
        since its node ran in place of the first one."""
        latest = dict(outputs)
        for node_id, output in outputs.items():
            tokens = output.get(REPORT_TOKEN) if isinstance(output, dict) else None
            token = tokens[0] if isinstance(tokens, list) and tokens else None
            if isinstance(token, str) and token in self.reports:
                latest[node_id] = {**output, "text": self.reports[token]}
        return latest

    def _interruption(self, data: dict[str, Any]) -> dict[str, Any]:
        node_id = data.get("node_id")
        known = data.get("node_type") or (self.class_type(str(node_id)) if node_id is not None else None)
        return interruption_summary({**data, "node_type": known})

    def _server_end_on_client_clock(self, now: float) -> float:
        if self.server_end_ms is None or self._clock_offset is None:
            return now
        return max(self._current_since, min(now, self.server_end_ms / 1000 + self._clock_offset))

    def running_timing(self, now: float) -> NodeTiming | None:
        """The node running now, timed up to ``now`` with the steps it made: what a partial record (a
        timeout, a cancel, a lost server) keeps of it. ``None`` when no node runs."""
        if self._current is None:
            return None
        node_id = self._current
        return NodeTiming(
            node_id,
            self.class_type(node_id),
            now - self._current_since,
            steps=self._steps.get(node_id),
            step_seconds=[round(s, 6) for s in self._step_seconds.get(node_id, [])],
        )

    def _close_current(self, now: float) -> None:
        if (timing := self.running_timing(now)) is not None:
            self.timings.append(timing)
        self._current = None

    def apply_history(self, entry: dict[str, Any]) -> None:
        """Fill in what the socket did not deliver from a ``/history/{id}`` entry (it is authoritative)."""
        status = entry.get("status") or {}
        for kind, data in status.get("messages") or []:
            if not isinstance(data, dict):
                continue
            if kind == "execution_start" and self.server_start_ms is None:
                self.server_start_ms = _timestamp(data)
            elif kind == "execution_cached":
                self._dispatch(kind, data, 0.0)
            elif kind in ("execution_success", "execution_error", "execution_interrupted"):
                self.server_end_ms = self.server_end_ms or _timestamp(data)
                if kind == "execution_error":
                    self.status, self.error = "error", self.error or error_summary(data)
                elif kind == "execution_interrupted":
                    self.status, self.error = "interrupted", self.error or self._interruption(data)
        if self.status == "running":
            self.status = "success" if status.get("status_str", "success") == "success" else "error"
        # a node still open here lost its end event with the socket, or was cut short: timed up to the
        # server's end of the prompt
        self._close_current(self._server_end_on_client_clock(time.monotonic()))
        self.done = True

    @property
    def server_seconds(self) -> float | None:
        """The server's own execution window (``execution_start`` → end), from its timestamps."""
        if self.server_start_ms is None or self.server_end_ms is None:
            return None
        return (self.server_end_ms - self.server_start_ms) / 1000.0


def exception_name(raw: Any) -> str | None:
    """An exception type as ComfyUI reports it, without where a node pack is installed: ComfyUI names a
    pack's modules by its path (``/srv/ComfyUI/custom_nodes/leanvideo.int8.spec.Int8FormatError``)."""
    if raw is None:
        return None
    return str(raw).rpartition("/")[2].rpartition("custom_nodes.")[2]


def error_summary(data: dict[str, Any]) -> dict[str, Any]:
    """The run-record form of an ``execution_error`` message: node id, class and message."""
    return {
        "node_id": data.get("node_id"),
        "class_type": data.get("node_type"),
        "exception_type": exception_name(data.get("exception_type")),
        "message": str(data.get("exception_message", "")).strip(),
    }


def interruption_summary(data: dict[str, Any]) -> dict[str, Any]:
    """The run-record error of an ``execution_interrupted`` message (someone interrupted the server)."""
    node_id, node_type = data.get("node_id"), data.get("node_type")
    where = "before any node ran" if node_id is None else f"while node {node_id} ({node_type}) was running"
    return {
        "node_id": node_id,
        "class_type": node_type,
        "exception_type": None,
        "message": f"interrupted on the server {where}",
    }


def phase_seconds(timings: list[NodeTiming]) -> dict[str, float]:
    """Seconds spent per phase (model load, text encode, sampling, VAE decode, save, …)."""
    totals = dict.fromkeys(PHASES, 0.0)
    for timing in timings:
        if not timing.cached:
            totals[phase_of(timing.class_type)] += timing.seconds
    return {phase: round(seconds, 6) for phase, seconds in totals.items()}


def _timestamp(data: dict[str, Any]) -> int | None:
    value = data.get("timestamp")
    return int(value) if isinstance(value, (int, float)) else None
