"""Submit a workflow to a ComfyUI server, follow it over the websocket and collect its outputs.

The websocket is opened *before* the prompt is posted, with a ``prompt_id`` the client chooses, so no
event of our prompt can be missed. Server messages map to client-side bookkeeping as follows:

=========================  ==========================================================
server message             what the client does
=========================  ==========================================================
``execution_start``        marks the prompt start (queue wait ends)
``execution_cached``       records the listed nodes as cached (0 s)
``executing{node}``        closes the previous node's timer, opens one for ``node``
``progress{value,max}``    records step progress for the running node
``executed{node}``         keeps the node's UI output
``execution_error``        closes timers, keeps the error (raised after completion)
``execution_interrupted``  closes timers, marks the run interrupted
``execution_success``      notes success; history is *not* written yet
``executing{node: null}``  the prompt is finished and its history is written: stop
=========================  ==========================================================

If the socket drops, the client falls back to polling ``GET /history/{prompt_id}``.

Example::

    client = ComfyClient("http://127.0.0.1:8188")
    result = client.run(workflow, timeout=600)
    for node in result.nodes:
        print(node.node_id, node.class_type, node.seconds)
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websocket

from runner.errors import PromptFailedError, ServerError, WorkflowError

logger = logging.getLogger(__name__)

Workflow = dict[str, Any]


@dataclass
class NodeTiming:
    """Wall time one node took, as seen from the event stream."""

    node_id: str
    class_type: str
    seconds: float
    cached: bool = False
    steps: int | None = None


@dataclass
class PromptResult:
    """What happened to one submitted prompt."""

    prompt_id: str
    status: str
    submitted_at: float
    started_at: float | None
    finished_at: float
    nodes: list[NodeTiming] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    @property
    def wall_seconds(self) -> float:
        return self.finished_at - self.submitted_at

    @property
    def queue_seconds(self) -> float:
        return (self.started_at or self.submitted_at) - self.submitted_at


@dataclass
class _Follower:
    """Turns the event stream of one prompt into node timings."""

    prompt_id: str
    workflow: Workflow
    started_at: float | None = None
    current: str | None = None
    current_since: float = 0.0
    timings: list[NodeTiming] = field(default_factory=list)
    steps: dict[str, int] = field(default_factory=dict)
    status: str = "running"
    error: dict[str, Any] | None = None
    done: bool = False

    def class_type(self, node_id: str) -> str:
        node = self.workflow.get(node_id.split(".")[0].split(":")[-1], {})
        return str(node.get("class_type", "?")) if isinstance(node, dict) else "?"

    def close_current(self, now: float) -> None:
        if self.current is not None:
            self.timings.append(
                NodeTiming(
                    self.current,
                    self.class_type(self.current),
                    now - self.current_since,
                    steps=self.steps.get(self.current),
                )
            )
        self.current = None

    def handle(self, message: dict[str, Any], now: float) -> None:
        kind = message.get("type")
        data = message.get("data") or {}
        if data.get("prompt_id") not in (None, self.prompt_id):
            return
        if kind == "execution_start":
            self.started_at = now
        elif kind == "execution_cached":
            for node_id in data.get("nodes", []):
                self.timings.append(NodeTiming(node_id, self.class_type(node_id), 0.0, cached=True))
        elif kind == "executing" and data.get("prompt_id") == self.prompt_id:
            self.close_current(now)
            if data.get("node") is None:
                self.done = True
                if self.status == "running":
                    self.status = "success"
            else:
                self.current, self.current_since = str(data["node"]), now
        elif kind == "progress" and data.get("node") is not None:
            self.steps[str(data["node"])] = int(data.get("max", 0))
        elif kind == "execution_error":
            self.close_current(now)
            self.status, self.error, self.done = "error", data, True
        elif kind == "execution_interrupted":
            self.close_current(now)
            self.status, self.done = "interrupted", True


class ComfyClient:
    """A small synchronous client for one ComfyUI server."""

    def __init__(self, base_url: str, *, client_id: str | None = None, http_timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.client_id = client_id or uuid.uuid4().hex
        self._http = httpx.Client(base_url=self.base_url, timeout=http_timeout)

    def close(self) -> None:
        self._http.close()

    def get_json(self, path: str) -> Any:
        """GET ``path`` and decode the JSON answer."""
        try:
            response = self._http.get(path)
        except httpx.TransportError as exc:
            raise ServerError(f"cannot reach ComfyUI at {self.base_url}{path}: {exc}") from exc
        if response.status_code != 200:
            raise ServerError(
                f"GET {self.base_url}{path} answered {response.status_code}: {response.text[:200]}"
            )
        return response.json()

    def submit(self, workflow: Workflow, prompt_id: str | None = None) -> str:
        """POST the workflow to ``/prompt``; returns the prompt id (ours, not the server's)."""
        prompt_id = prompt_id or str(uuid.uuid4())
        body = {"prompt": workflow, "client_id": self.client_id, "prompt_id": prompt_id}
        response = self._http.post("/prompt", json=body)
        if response.status_code == 400:
            raise WorkflowError(describe_rejection(response.json()))
        if response.status_code != 200:
            raise ServerError(f"POST /prompt answered {response.status_code}: {response.text[:300]}")
        return prompt_id

    def run(self, workflow: Workflow, *, timeout: float = 1800.0) -> PromptResult:
        """Submit ``workflow``, follow it to the end and return its timings and outputs.

        Raises:
            WorkflowError: the server's validation rejected the workflow (names the node and input).
            PromptFailedError: execution failed or was interrupted.
        """
        ws_url = self.base_url.replace("http", "ws", 1) + f"/ws?clientId={self.client_id}"
        sock = websocket.create_connection(ws_url, timeout=5.0)
        submitted = time.monotonic()
        wall_start = time.time()
        try:
            prompt_id = self.submit(workflow)
            follower = _Follower(prompt_id, workflow)
            deadline = submitted + timeout
            try:
                self._follow(sock, follower, deadline)
            except (websocket.WebSocketException, OSError) as exc:
                logger.warning("websocket lost (%s); polling history for %s", exc, prompt_id)
                self._wait_history(prompt_id, deadline)
                follower.status = follower.status if follower.status != "running" else "success"
        finally:
            sock.close()
        finished = time.monotonic()
        entry = self._wait_history(prompt_id, deadline)
        status_info = entry.get("status", {})
        if status_info.get("status_str") == "error" and follower.status == "success":
            follower.status = "error"
        result = PromptResult(
            prompt_id=prompt_id,
            status=follower.status,
            submitted_at=wall_start,
            started_at=wall_start + (follower.started_at - submitted) if follower.started_at else None,
            finished_at=wall_start + (finished - submitted),
            nodes=follower.timings,
            outputs=entry.get("outputs", {}),
            error=follower.error,
        )
        if result.status != "success":
            raise PromptFailedError(describe_failure(result))
        return result

    def _follow(self, sock: websocket.WebSocket, follower: _Follower, deadline: float) -> None:
        while not follower.done:
            if time.monotonic() > deadline:
                self._http.post("/interrupt", json={"prompt_id": follower.prompt_id})
                raise PromptFailedError(f"prompt {follower.prompt_id} did not finish in time; interrupted")
            try:
                raw = sock.recv()
            except websocket.WebSocketTimeoutException:
                continue
            if isinstance(raw, str) and raw:
                follower.handle(json.loads(raw), time.monotonic())

    def _wait_history(self, prompt_id: str, deadline: float) -> dict[str, Any]:
        while True:
            history = self.get_json(f"/history/{prompt_id}")
            if prompt_id in history:
                return dict(history[prompt_id])
            if time.monotonic() > deadline:
                raise PromptFailedError(f"prompt {prompt_id} has no history entry before the timeout")
            time.sleep(0.2)

    def download(self, item: dict[str, Any], dest_dir: Path, *, name: str | None = None) -> Path:
        """Fetch one output file (an entry of a node's ``images``/``gifs``/… list) into ``dest_dir``.

        The file keeps the server's name unless ``name`` is given; an existing file is never replaced.
        """
        params = {"filename": item["filename"], "subfolder": item.get("subfolder", ""), "type": item["type"]}
        response = self._http.get("/view", params=params)
        if response.status_code != 200:
            raise ServerError(f"GET /view {params} answered {response.status_code}")
        dest_dir.mkdir(parents=True, exist_ok=True)
        target = dest_dir / Path(name or item["filename"]).name
        if target.exists():
            raise FileExistsError(f"{target} already exists; refusing to overwrite it")
        target.write_bytes(response.content)
        return target


def output_files(outputs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every file entry in a history ``outputs`` mapping, as ``(node_id, entry)`` pairs."""
    found: list[tuple[str, dict[str, Any]]] = []
    for node_id, output in outputs.items():
        for value in output.values():
            if isinstance(value, list):
                found += [(node_id, v) for v in value if isinstance(v, dict) and "filename" in v]
    return found


def describe_rejection(body: dict[str, Any]) -> str:
    """One readable message from a 400 answer of ``POST /prompt``, naming nodes and inputs."""
    error = body.get("error", {})
    lines = [f"server rejected the workflow: {error.get('message', 'unknown error')}"]
    if error.get("details"):
        lines[0] += f" ({error['details']})"
    for node_id, node in body.get("node_errors", {}).items():
        for item in node.get("errors", []):
            name = item.get("extra_info", {}).get("input_name", "")
            where = f"node {node_id} ({node.get('class_type', '?')})" + (f" input {name!r}" if name else "")
            lines.append(f"  {where}: {item.get('message', '')} {item.get('details', '')}".rstrip())
    return "\n".join(lines)


def describe_failure(result: PromptResult) -> str:
    """One readable message for a failed or interrupted prompt."""
    if result.status == "interrupted":
        return f"prompt {result.prompt_id} was interrupted"
    error = result.error or {}
    return (
        f"prompt {result.prompt_id} failed in node {error.get('node_id', '?')} "
        f"({error.get('node_type', '?')}): {error.get('exception_type', '')}: "
        f"{str(error.get('exception_message', '')).strip()}"
    )
