"""Submit a workflow to a ComfyUI server, follow it over the websocket, survive drops, collect results.

Submitting: the websocket is opened *before* the prompt is posted, with a ``prompt_id`` the client
chooses, so no event of our prompt can be missed. :mod:`runner.events` documents the table mapping
server messages to client events; ``executing{node: null}`` is taken as completion, and the history
entry is then polled until it is written (the websocket/history race).

Following, and what goes wrong:

- **socket drop**: reconnect with exponential backoff (0.1 s doubling to 2 s, for at most
  ``reconnect_timeout``), then reconcile: ``GET /history/{id}`` (finished while we were away) else
  ``GET /queue`` (still running or pending: keep following) else :class:`PromptLostError` (the server
  restarted and forgot it). Nodes whose events fell into the gap get their result from history.
- **server gone**: :class:`ServerUnreachableError` once reconnecting has failed for ``reconnect_timeout``.
- **quiet socket**: every ``idle_check`` seconds without a message the client reconciles as well.
- **timeout**: the prompt is removed from the queue and interrupted; :class:`PromptTimeoutError`.
- **Ctrl-C**: the same clean-up, then :class:`PromptCancelledError` (exit 130) carrying the partial
  result. Both carry ``result`` so a partial run record can be written.
- **proxies**: ``headers`` and ``token`` (sent as ``Authorization: Bearer``) go with every HTTP request
  and the websocket handshake.

Example::

    client = ComfyClient("http://127.0.0.1:8188")
    result = client.run(workflow, timeout=600)
    for node in result.nodes:
        print(node.node_id, node.class_type, node.seconds)
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import websocket

from runner.errors import (
    PromptCancelledError,
    PromptFailedError,
    PromptLostError,
    PromptTimeoutError,
    ServerError,
    ServerUnreachableError,
    WorkflowError,
)
from runner.events import ClientEvent, NodeTiming, PromptTracker
from runner.follow import EventHandler, FollowTimeout, close_socket, follow_prompt
from runner.result import (
    PromptResult,
    describe_failure,
    describe_rejection,
    output_files,
    result_from_tracker,
)

logger = logging.getLogger(__name__)

DEFAULT_SERVER = "http://127.0.0.1:8188"
TELEMETRY_ROUTE = "/leanvideo/telemetry/prompts/{prompt_id}"

Workflow = dict[str, Any]

__all__ = [
    "DEFAULT_SERVER",
    "ClientEvent",
    "ComfyClient",
    "EventHandler",
    "NodeTiming",
    "PromptResult",
    "describe_failure",
    "describe_rejection",
    "output_files",
]


class ComfyClient:
    """A small synchronous client for one ComfyUI server; see the module docstring."""

    def __init__(
        self,
        base_url: str = DEFAULT_SERVER,
        *,
        client_id: str | None = None,
        http_timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        reconnect_timeout: float = 60.0,
        idle_check: float = 2.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client_id = client_id or uuid.uuid4().hex
        self.headers = dict(headers or {})
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.reconnect_timeout = reconnect_timeout
        self.idle_check = idle_check
        self._http = httpx.Client(base_url=self.base_url, timeout=http_timeout, headers=self.headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ComfyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plain HTTP -------------------------------------------------------------------------------

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

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise ServerError(f"cannot reach ComfyUI at {self.base_url}{path}: {exc}") from exc

    def submit(self, workflow: Workflow, prompt_id: str | None = None) -> str:
        """POST the workflow to ``/prompt``; returns the prompt id (ours, not the server's)."""
        prompt_id = prompt_id or str(uuid.uuid4())
        body = {"prompt": workflow, "client_id": self.client_id, "prompt_id": prompt_id}
        response = self._post("/prompt", body)
        if response.status_code == 400:
            raise WorkflowError(describe_rejection(response.json()))
        if response.status_code != 200:
            raise ServerError(f"POST /prompt answered {response.status_code}: {response.text[:300]}")
        return prompt_id

    def cancel(self, prompt_id: str) -> None:
        """Remove ``prompt_id`` from the queue, then interrupt it if it is running (best effort)."""
        for path, body in (("/queue", {"delete": [prompt_id]}), ("/interrupt", {"prompt_id": prompt_id})):
            try:
                self._post(path, body)
            except ServerError as exc:
                logger.warning("could not POST %s for %s: %s", path, prompt_id, exc)

    def read_telemetry(self, prompt_id: str) -> dict[str, Any]:
        """Per-prompt peak VRAM / RSS / energy from the node pack's telemetry route, when present.

        Returns ``{"available": True, ...the route's fields}`` or ``{"available": False, "reason": …}``.
        """
        path = TELEMETRY_ROUTE.format(prompt_id=prompt_id)
        try:
            response = self._http.get(path)
        except httpx.TransportError as exc:
            return {"available": False, "reason": f"GET {path} failed: {exc}"}
        if response.status_code == 404:
            return {"available": False, "reason": f"GET {path} answered 404 (no telemetry for this prompt)"}
        if response.status_code != 200:
            return {"available": False, "reason": f"GET {path} answered {response.status_code}"}
        try:
            body = response.json()
        except ValueError:
            return {"available": False, "reason": f"GET {path} did not answer JSON"}
        return (
            {"available": True, **body}
            if isinstance(body, dict)
            else {"available": False, "reason": "not an object"}
        )

    # -- following a prompt -----------------------------------------------------------------------

    def run(
        self,
        workflow: Workflow,
        *,
        timeout: float = 1800.0,
        on_event: EventHandler | None = None,
        prompt_id: str | None = None,
    ) -> PromptResult:
        """Submit ``workflow``, follow it to the end and return its timings and outputs.

        Raises:
            WorkflowError: the server's validation rejected the workflow (names the node and input).
            PromptFailedError: execution failed or was interrupted (``result`` holds what happened).
            PromptTimeoutError: not finished within ``timeout`` seconds; it was cancelled on the server.
            PromptCancelledError: Ctrl-C; the prompt was cancelled on the server.
            PromptLostError, ServerUnreachableError: the server restarted or went away.
        """
        prompt_id = prompt_id or str(uuid.uuid4())
        tracker = PromptTracker(prompt_id, workflow)
        emit = on_event or (lambda event: None)
        sock = self.connect_websocket()
        submitted, wall_start = time.monotonic(), time.time()
        deadline = submitted + timeout
        reconnects = [0]
        try:
            try:
                self.submit(workflow, prompt_id)
            except BaseException:
                close_socket(sock)
                raise
            entry = follow_prompt(self, sock, tracker, deadline, emit, reconnects)
        except KeyboardInterrupt:
            result = self._abandon(tracker, wall_start, submitted, reconnects[0], "cancelled")
            raise PromptCancelledError(
                f"prompt {prompt_id} cancelled; removed from the server", result
            ) from None
        except (PromptLostError, ServerUnreachableError) as exc:
            tracker.status = "lost" if isinstance(exc, PromptLostError) else "unreachable"
            exc.result = result_from_tracker(tracker, wall_start, submitted, None, reconnects[0])
            exc.result.partial = True
            raise
        except FollowTimeout:
            result = self._abandon(tracker, wall_start, submitted, reconnects[0], "timeout")
            raise PromptTimeoutError(
                f"prompt {prompt_id} did not finish within {timeout:g} s; it was interrupted", result
            ) from None
        result = result_from_tracker(tracker, wall_start, submitted, entry, reconnects[0])
        if result.status != "success":
            raise PromptFailedError(describe_failure(result), result)
        return result

    def _ws_url(self) -> str:
        return self.base_url.replace("http", "ws", 1) + f"/ws?clientId={self.client_id}"

    def connect_websocket(self) -> websocket.WebSocket:
        header = [f"{key}: {value}" for key, value in self.headers.items()]
        try:
            return websocket.create_connection(self._ws_url(), timeout=1.0, header=header)
        except (websocket.WebSocketException, OSError) as exc:
            raise ServerError(f"cannot open the websocket of {self.base_url}: {exc}") from exc

    def _abandon(
        self, tracker: PromptTracker, wall_start: float, submitted: float, reconnects: int, status: str
    ) -> PromptResult:
        """Cancel the prompt on the server and return what is known of it, marked partial."""
        logger.warning("cancelling prompt %s on %s (%s)", tracker.prompt_id, self.base_url, status)
        running = tracker.current_node
        self.cancel(tracker.prompt_id)
        entry: dict[str, Any] | None = None
        with contextlib.suppress(ServerError):
            give_up = time.monotonic() + 5.0
            while entry is None and time.monotonic() < give_up:
                entry = self.history_entry(tracker.prompt_id)
                if entry is None and not self.is_queued(tracker.prompt_id):
                    break
                time.sleep(0.05)
        if entry is not None:
            tracker.apply_history(entry)
        tracker.status = status
        result = result_from_tracker(tracker, wall_start, submitted, entry, reconnects)
        result.partial = True
        where = f"while node {running} was running" if running else "before any node ran"
        result.error = {
            "node_id": running,
            "class_type": tracker.class_type(running) if running else None,
            "exception_type": None,
            "message": f"{status} {where}",
        }
        return result

    def history_entry(self, prompt_id: str) -> dict[str, Any] | None:
        """The prompt's ``/history/{id}`` entry, or ``None`` while it is not written (yet)."""
        history = self.get_json(f"/history/{prompt_id}")
        return dict(history[prompt_id]) if isinstance(history, dict) and prompt_id in history else None

    def is_queued(self, prompt_id: str) -> bool:
        """Whether ``/queue`` lists the prompt as running or pending."""
        queue = self.get_json("/queue")
        return any(
            len(item) > 1 and item[1] == prompt_id
            for key in ("queue_running", "queue_pending")
            for item in queue.get(key, [])
        )

    # -- files ------------------------------------------------------------------------------------

    def download(self, item: dict[str, Any], dest_dir: Path, *, name: str | None = None) -> Path:
        """Fetch one output file into ``dest_dir`` under its own name (or ``name``); never overwrites.

        :func:`runner.outputs.download_outputs` fetches all files of a prompt, checked and hashed.
        """
        from runner.outputs import download_file  # imported here: outputs builds on this module

        return download_file(self, item, dest_dir, name=name)

    def open_view(self, item: dict[str, Any]) -> AbstractContextManager[httpx.Response]:
        """Stream one output file (an entry of a node's ``images``/``gifs``/… list) from ``GET /view``.

        Use as a context manager; :func:`runner.outputs.download_outputs` writes, checks and hashes it.
        """
        params = {"filename": item["filename"], "subfolder": item.get("subfolder", ""), "type": item["type"]}
        return self._http.stream("GET", "/view", params=params)
