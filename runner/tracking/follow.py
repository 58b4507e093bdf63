"""Follow one submitted prompt over the websocket until it is done, surviving drops and restarts.

:func:`follow_prompt` reads messages into a :class:`~runner.tracking.events.PromptTracker` (the
message → event table is in :mod:`runner.tracking.events`). On a drop it reconnects with exponential
backoff (0.1 s doubling to 2 s, for at most ``client.reconnect_timeout``) and reconciles: the
``/history/{id}`` entry when the prompt finished meanwhile, else ``/queue`` (still there: keep
following), else
:class:`~runner.errors.PromptLostError` (the server restarted and forgot it). A socket quiet for
``client.idle_check`` seconds is reconciled the same way. After ``executing{node: null}`` the history
entry is polled until it is written (the websocket/history race). Where the websocket is refused (a
proxy that does not pass it on), :func:`poll_prompt` follows the prompt by asking ``/history`` and
``/queue`` alone.

Example::

    entry = follow_prompt(client, sock, PromptTracker(prompt_id, workflow), deadline, print, [0])
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import websocket

from runner.errors import PromptLostError, ServerError, ServerUnreachableError
from runner.tracking.events import ClientEvent, PromptTracker
from runner.transport.answers import GATEWAY_STATUSES

if TYPE_CHECKING:
    from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

EventHandler = Callable[[ClientEvent], None]


class FollowTimeout(Exception):
    """The deadline passed while following (the caller cancels the prompt); ``unreachable``: why the
    server could not be reached then, when it could not (it went away mid-prompt: said as such)."""

    def __init__(self, unreachable: str | None = None) -> None:
        super().__init__(unreachable or "deadline passed")
        self.unreachable = unreachable


def follow_prompt(
    client: ComfyClient,
    sock: websocket.WebSocket | None,
    tracker: PromptTracker,
    deadline: float,
    emit: EventHandler,
    reconnects: list[int],
) -> dict[str, Any]:
    """Read events until completion; returns the prompt's history entry."""
    last_heard = time.monotonic()
    trouble_since: float | None = None  # first failure of the current run of failures
    trouble = ""  # the last of them
    try:
        while not tracker.done:
            if time.monotonic() > deadline:
                raise FollowTimeout(trouble if trouble_since is not None else None)
            if sock is None:
                sock = _reconnect(client, deadline)
                reconnects[0] += 1
                last_heard = 0.0  # reconcile at once: events may have been lost in the gap
            try:
                if time.monotonic() - last_heard > client.idle_check:
                    last_heard = time.monotonic()
                    entry = _reconcile(client, tracker.prompt_id)
                    if entry is not None:
                        tracker.apply_history(entry)
                        return entry
                raw = sock.recv()
            except websocket.WebSocketTimeoutException:
                emit(ClientEvent("waiting"))  # a handler that stops the prompt gets its turn while it waits
                continue
            except (websocket.WebSocketException, OSError, ServerUnreachableError) as exc:
                logger.warning("lost the server while following %s: %s", tracker.prompt_id, exc)
                close_socket(sock)
                sock = None
                trouble_since, trouble = trouble_since or time.monotonic(), str(exc)
                if time.monotonic() - trouble_since > client.reconnect_timeout:
                    raise ServerUnreachableError(
                        f"ComfyUI at {client.base_url} has failed for {client.reconnect_timeout:g} s: {exc}"
                    ) from exc
                time.sleep(0.05)
                continue
            if not sock.connected:
                logger.warning("websocket closed by the server while following %s", tracker.prompt_id)
                close_socket(sock)
                sock = None
                continue
            last_heard, trouble_since = time.monotonic(), None
            if isinstance(raw, str) and raw:
                for event in tracker.handle(decode_message(raw), last_heard):
                    emit(event)
    finally:
        if sock is not None:
            close_socket(sock)
    entry = wait_history(client, tracker.prompt_id, deadline)
    tracker.apply_history(entry)
    return entry


POLL_INTERVAL_S = 0.5  # without a websocket: how often the prompt's history and the queue are asked


def poll_prompt(
    client: ComfyClient, tracker: PromptTracker, deadline: float, emit: EventHandler
) -> dict[str, Any]:
    """Follow a submitted prompt without a websocket (a proxy in front of the server refused it): ask
    ``/history/{id}`` and ``/queue`` every :data:`POLL_INTERVAL_S` until its history entry is written;
    returns the entry. The prompt is taken as started when ``/queue`` first lists it as running (within
    that interval); no step's progress is seen, nor any node's own time: the entry has the server's
    start and end. The server failing for ``client.reconnect_timeout`` is
    :class:`~runner.errors.ServerUnreachableError`, as when following over the websocket."""
    trouble_since: float | None = None
    trouble = ""
    while True:
        now = time.monotonic()
        if now > deadline:
            raise FollowTimeout(trouble if trouble_since is not None else None)
        try:
            entry, place = _look(client, tracker.prompt_id)
        except ServerUnreachableError as exc:
            trouble_since, trouble = trouble_since or now, str(exc)
            if now - trouble_since > client.reconnect_timeout:
                raise ServerUnreachableError(
                    f"ComfyUI at {client.base_url} has failed for {client.reconnect_timeout:g} s: {exc}"
                ) from exc
        else:
            trouble_since = None
            if entry is not None:
                tracker.apply_history(entry)
                return entry
            if place == "running" and tracker.started_at is None:  # as execution_start would say
                started = {"type": "execution_start", "data": {"prompt_id": tracker.prompt_id}}
                for event in tracker.handle(started, time.monotonic()):
                    emit(event)
        emit(ClientEvent("waiting"))  # a handler that stops the prompt gets its turn
        time.sleep(max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic())))


def _look(client: ComfyClient, prompt_id: str) -> tuple[dict[str, Any] | None, str | None]:
    """The prompt's history entry when it is finished, else where ``/queue`` has it (running, pending).

    Raises:
        PromptLostError: neither history nor queue knows the prompt.
        ServerUnreachableError: the HTTP requests themselves failed (an answer that refuses: as is).
    """
    try:
        entry = client.history_entry(prompt_id)
        if entry is not None:
            return entry, None
        if (place := client.queue_place(prompt_id)) is not None:
            return None, place
        entry = client.history_entry(prompt_id)  # it may have finished between the two requests
    except ServerError as exc:
        if refused(exc):
            raise
        raise ServerUnreachableError(str(exc)) from exc
    if entry is not None:
        return entry, None
    raise PromptLostError(
        f"the server at {client.base_url} no longer knows prompt {prompt_id}: neither /history nor "
        "/queue lists it (the server was probably restarted)"
    )


def _reconnect(client: ComfyClient, deadline: float) -> websocket.WebSocket:
    give_up = min(deadline, time.monotonic() + client.reconnect_timeout)
    delay = 0.1
    while True:
        try:
            sock = client.connect_websocket(retry=False)
            logger.info("websocket reconnected to %s", client.base_url)
            return sock
        except ServerError as exc:
            if time.monotonic() + delay > give_up:
                if time.monotonic() + delay > deadline:
                    raise FollowTimeout(str(exc)) from exc
                raise ServerUnreachableError(
                    f"lost ComfyUI at {client.base_url} and could not reconnect within "
                    f"{client.reconnect_timeout:g} s: {exc}"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _reconcile(client: ComfyClient, prompt_id: str) -> dict[str, Any] | None:
    """The history entry when the prompt is finished, ``None`` while the server still has it.

    Raises:
        PromptLostError: neither history nor queue knows the prompt.
        ServerUnreachableError: the HTTP requests themselves failed.
    """
    return _look(client, prompt_id)[0]


def wait_history(client: ComfyClient, prompt_id: str, deadline: float) -> dict[str, Any]:
    """Poll ``/history/{id}`` (5 ms doubling to 200 ms) until the entry is written. A server that fails
    to answer for ``client.reconnect_timeout`` is :class:`~runner.errors.ServerUnreachableError` (the
    caller keeps a partial record of the prompt), as it is while following."""
    delay = 0.005
    trouble_since: float | None = None
    while True:
        try:
            entry = client.history_entry(prompt_id)
        except ServerError as exc:
            if refused(exc):
                raise
            trouble_since = trouble_since or time.monotonic()
            if time.monotonic() - trouble_since > client.reconnect_timeout:
                raise ServerUnreachableError(
                    f"ComfyUI at {client.base_url} has failed for {client.reconnect_timeout:g} s after "
                    f"prompt {prompt_id} ended: {exc}"
                ) from exc
            entry = None
        if entry is not None:
            return entry
        if time.monotonic() > deadline:
            raise FollowTimeout
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def refused(error: ServerError) -> bool:
    """Whether ``error`` is an answer that waiting does not change (a proxy's 401 or 403, a 404): said
    at once, not waited out as a server that went away (a proxy's 502/503/504 is waited out)."""
    return error.status is not None and error.status not in GATEWAY_STATUSES


def close_socket(sock: websocket.WebSocket) -> None:
    """Close ``sock``; also its OS socket when the server has already closed the websocket (then
    ``close()`` alone does nothing)."""
    with contextlib.suppress(websocket.WebSocketException, OSError):
        sock.close(timeout=0.2)
    sock.shutdown()  # type: ignore[no-untyped-call]


def decode_message(raw: str) -> object:
    """The decoded JSON of a text message, ``None`` for anything that is not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        logger.debug("ignoring a websocket message that is not JSON: %.200r", raw)
        return None
