"""Run one prompt: submit it, follow it to the end over the websocket, survive drops, collect results.

Submitting: the websocket is opened *before* the prompt is posted, with a ``prompt_id`` the client
chooses, so no event of our prompt can be missed (a websocket a proxy refuses: the prompt is followed by
polling its history, said once per prompt). :mod:`runner.tracking.events` documents the table
mapping server messages to client events; ``executing{node: null}`` is taken as completion, and the
history entry is then polled until it is written (the websocket/history race).

Following, and what goes wrong (:mod:`runner.tracking.follow` does the following):

- **socket drop**: reconnect with exponential backoff (0.1 s doubling to 2 s, for at most
  ``reconnect_timeout``), then reconcile: ``GET /history/{id}`` (finished while we were away) else
  ``GET /queue`` (still running or pending: keep following) else :class:`PromptLostError` (the server
  restarted and forgot it). Nodes whose events fell into the gap get their result from history.
- **server gone**: :class:`ServerUnreachableError` once reconnecting has failed for ``reconnect_timeout``.
- **quiet socket**: every ``idle_check`` seconds without a message the client reconciles as well.
- **timeout**: the prompt is removed from the queue and interrupted; :class:`PromptTimeoutError`.
- **Ctrl-C**: the same clean-up, then :class:`PromptCancelledError` (exit 130) carrying the partial
  result. Both carry ``result`` so a partial run record can be written.

Example::

    with ComfyClient("http://127.0.0.1:8188") as client:
        result = run_prompt(client, workflow, timeout=600)
    for node in result.nodes:
        print(node.node_id, node.class_type, node.seconds)
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Any

from runner.errors import (
    LeanVideoError,
    PromptCancelledError,
    PromptFailedError,
    PromptLostError,
    PromptTimeoutError,
    ServerError,
    ServerUnreachableError,
)
from runner.tracking.events import ClientEvent, PromptTracker
from runner.tracking.follow import (
    POLL_INTERVAL_S,
    EventHandler,
    FollowTimeout,
    close_socket,
    follow_prompt,
    poll_prompt,
)
from runner.tracking.result import PromptResult, describe_failure, result_from_tracker
from runner.transport.client import ComfyClient, WebsocketRefused, Workflow

logger = logging.getLogger(__name__)

__all__ = ["run_prompt"]


def run_prompt(
    client: ComfyClient,
    workflow: Workflow,
    *,
    timeout: float = 1800.0,
    deadline: float | None = None,
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
    handle = on_event or (lambda event: None)
    handler_failed = queued = False

    def emit(event: ClientEvent) -> None:
        nonlocal handler_failed
        try:
            handle(event)
        except BaseException:
            handler_failed = True
            raise

    try:
        sock = client.connect_websocket()
    except WebsocketRefused as refused:
        logger.warning(
            "%s; the prompt is followed by asking /history and /queue every %g s instead (no progress "
            "of its steps, no node's own time): let the proxy pass websockets on for /ws",
            refused,
            POLL_INTERVAL_S,
        )
        sock = None
    submitted, wall_start = time.monotonic(), time.time()
    # ``deadline`` (time.monotonic()) is a whole job's, which began before this prompt was submitted.
    deadline = submitted + timeout if deadline is None else min(deadline, submitted + timeout)
    reconnects = [0]
    try:
        try:
            client.submit(workflow, prompt_id)
        except BaseException:
            if sock is not None:
                close_socket(sock)
            raise
        queued = True
        entry = (
            poll_prompt(client, tracker, deadline, emit)
            if sock is None
            else follow_prompt(client, sock, tracker, deadline, emit, reconnects)
        )
    except (KeyboardInterrupt, BrokenPipeError) as stop:  # Ctrl-C, or the reader of stdout went away
        result, stopped = _abandon(client, tracker, wall_start, submitted, reconnects[0], "cancelled")
        why = "stdout was closed: " if isinstance(stop, BrokenPipeError) else ""
        raise PromptCancelledError(
            f"prompt {prompt_id} cancelled; {why}{_on_server(stopped, tracker.started_at is not None)}",
            result,
        ) from (stop if isinstance(stop, BrokenPipeError) else None)
    except (PromptLostError, ServerUnreachableError) as exc:
        _record_lost(exc, tracker, wall_start, submitted, reconnects[0])
        raise
    except FollowTimeout as late:
        if late.unreachable is not None:  # it went away mid-prompt and had not come back: no timeout
            with client.quick(CANCEL_REQUEST_TIMEOUT_S) as quick:  # best effort: a paused server takes
                quick.cancel(prompt_id)  # the requests in when it resumes, and does not run it on
            lost = ServerUnreachableError(
                f"lost ComfyUI at {client.base_url} while it ran prompt {prompt_id}, and it had not come "
                f"back when the {timeout:g} s timeout ran out: {late.unreachable}"
            )
            _record_lost(lost, tracker, wall_start, submitted, reconnects[0])
            raise lost from None
        result, stopped = _abandon(client, tracker, wall_start, submitted, reconnects[0], "timeout")
        raise PromptTimeoutError(
            f"prompt {prompt_id} did not finish within {timeout:g} s; "
            f"{_on_server(stopped, tracker.started_at is not None)}",
            result,
        ) from None
    except BaseException as error:
        # The caller's event handler raised (whatever it raised), or SystemExit came: the prompt must not
        # run on unseen. An error of the runner's own (the server refused or lost it) leaves nothing
        # running there, and a prompt that was never sent has nothing to cancel.
        if queued and (handler_failed or not isinstance(error, LeanVideoError)):
            with contextlib.suppress(Exception):  # the caller's error is the one to see
                _abandon(client, tracker, wall_start, submitted, reconnects[0], "cancelled")
        raise
    result = result_from_tracker(tracker, wall_start, submitted, entry, reconnects[0])
    if result.status != "success":
        raise PromptFailedError(describe_failure(result), result)
    return result


# How long each request of a stop (cancel, then the prompt's last state) may wait: a server that is
# paused takes them in when it resumes, and the command must end within a supervisor's grace (docker
# stop, timeout -k: about 10 s)
CANCEL_REQUEST_TIMEOUT_S = 2.0


def _record_lost(
    error: PromptLostError | ServerUnreachableError,
    tracker: PromptTracker,
    wall_start: float,
    submitted: float,
    reconnects: int,
) -> None:
    """Give ``error`` the partial result of a prompt the server lost, or that was lost with the server."""
    running = tracker.current_node
    tracker.status = "lost" if isinstance(error, PromptLostError) else "unreachable"
    error.result = result_from_tracker(tracker, wall_start, submitted, None, reconnects)
    error.result.partial = True
    error.result.error = error.result.error or {
        "node_id": running,
        "class_type": tracker.class_type(running) if running else None,
        "exception_type": type(error).__name__,
        "message": str(error),
    }


def _on_server(stopped: bool, started: bool) -> str:
    if stopped and not started:
        return "it was still waiting in the server's queue, and was removed from it"
    if stopped:
        return "removed from the server's queue and interrupted there"
    return "the server did not answer the cancel requests: it may still be queued or running there"


def _abandon(
    client: ComfyClient,
    tracker: PromptTracker,
    wall_start: float,
    submitted: float,
    reconnects: int,
    status: str,
) -> tuple[PromptResult, bool]:
    """Cancel the prompt on the server; what is known of it (marked partial) and whether the server
    took the cancel requests."""
    logger.warning("cancelling prompt %s on %s (%s)", tracker.prompt_id, client.base_url, status)
    running = tracker.current_node
    where = _where(tracker)  # as it was when stopped, before the history fills in what it can
    entry: dict[str, Any] | None = None
    with client.quick(CANCEL_REQUEST_TIMEOUT_S) as quick:  # a paused server held each request 30 s
        stopped = quick.cancel(tracker.prompt_id)
        with contextlib.suppress(ServerError):
            give_up = time.monotonic() + 5.0
            while entry is None and time.monotonic() < give_up:
                entry = quick.history_entry(tracker.prompt_id)
                if entry is None and not quick.is_queued(tracker.prompt_id):
                    break
                time.sleep(0.05)
    if entry is not None:
        tracker.apply_history(entry)
    tracker.status = status
    result = result_from_tracker(tracker, wall_start, submitted, entry, reconnects)
    result.partial = True
    result.error = {
        "node_id": running,
        "class_type": tracker.class_type(running) if running else None,
        "exception_type": None,
        "message": f"{status} {where}",
    }
    return result, stopped


def _where(tracker: PromptTracker) -> str:
    """Where the prompt was as the client saw it: in a node, before any, or after one."""
    if (running := tracker.current_node) is not None:
        return f"while node {running} was running"
    if tracker.started_at is None:
        return "before any node ran"
    if not tracker.timings:  # followed without a websocket: the queue said it runs, not what
        return "after it started (which node ran is not known without the websocket)"
    return f"after node {tracker.timings[-1].node_id} ended"
