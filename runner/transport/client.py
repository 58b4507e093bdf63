"""The transport to one ComfyUI server: plain HTTP calls and the websocket, nothing more.

:class:`ComfyClient` posts prompts (``POST /prompt``, a 400 answer turned into a
:class:`~runner.errors.WorkflowError` naming each node and input), reads ``/history``, ``/queue``,
``/object_info``, ``/system_stats`` and the node pack's routes, cancels, opens the websocket and streams
``/view``. Following a prompt to its end is :func:`runner.tracking.prompt.run_prompt`'s job, and
downloading outputs :mod:`runner.tracking.outputs`'.

Behind a proxy, ``headers`` and ``token`` (sent as ``Authorization: Bearer``) go with every HTTP request
and the websocket handshake. Requests the network cuts are retried as :mod:`runner.transport.retry`
says (``retry``, within ``deadline``); ``retries_made`` counts them.

Example::

    with ComfyClient("http://127.0.0.1:8188", token="…") as client:
        stats = client.get_json("/system_stats")
        prompt_id = client.submit(workflow)
"""

from __future__ import annotations

import logging
import random
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import httpx
import websocket

from runner.errors import ServerError, UsageError
from runner.transport.answers import (
    GATEWAY_STATUSES,
    GatewayAnswer,
    body_text,
    describe_answer,
    failure_text,
    forward_proxy,
    rejection,
    status_reason,
    tls_problem,
)
from runner.transport.retry import RetryPolicy
from runner.transport.server_url import check_server_url
from runner.transport.tls import trust_context

logger = logging.getLogger(__name__)

DEFAULT_SERVER = "http://127.0.0.1:8188"
TELEMETRY_ROUTE = "/leanvideo/telemetry/prompts/{prompt_id}"
# After a cut POST /prompt, how long the server gets to queue what it may have received before the
# client asks whether it did (ComfyUI validates, queues, then answers).
SUBMIT_SETTLE_S = 0.5
MIN_REQUEST_TIMEOUT_S = 1.0  # a request made as the deadline passes (the last status) still gets this

Workflow = dict[str, Any]
T = TypeVar("T")

__all__ = ["DEFAULT_SERVER", "ComfyClient", "WebsocketRefused"]


class WebsocketRefused(ServerError):
    """The server, or a proxy in front of it, answered the websocket handshake with a refusal (a 4xx
    status): asking again changes nothing, so it is not repeated; a prompt is then followed by polling
    (:func:`runner.tracking.follow.poll_prompt`)."""


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
        retry: RetryPolicy | None = None,
        deadline: float | None = None,
    ) -> None:
        self.base_url = check_server_url(base_url).rstrip("/")  # a typo is said now, not after the retries
        self.client_id = client_id or uuid.uuid4().hex
        self.headers = dict(headers or {})
        if token:
            if any(name.lower() == "authorization" for name in self.headers):
                raise UsageError("both a token and an Authorization header were given: give one of them")
            self.headers["Authorization"] = f"Bearer {token}"
        for name, value in self.headers.items():  # httpx would fail at the first request, untold which
            if not (name.isascii() and value.isascii()):
                shown = "the token" if name == "Authorization" and token else f"header {name!r}"
                raise UsageError(f"{shown}: HTTP headers carry ASCII only")
        self.reconnect_timeout = reconnect_timeout
        self.idle_check = idle_check
        self.retry = retry or RetryPolicy()
        self.deadline = deadline  # time.monotonic() after which no retry starts; None: no deadline
        self.retries_made = 0  # requests repeated after a cut, over this client's life
        self._http_timeout = http_timeout
        # HTTPS: one set of trusted certificates for requests and the websocket (see .tls); plain HTTP
        # checks none (not httpx's default, which fails on a $SSL_CERT_FILE naming nothing). Made once:
        # each renewed pool (a retry) takes it again
        self._trust = trust_context() if self.base_url.startswith("https:") else None
        self._verify = self._trust if self._trust is not None else ssl.create_default_context()
        self._rng = random.Random()
        self._http = self._new_pool()

    def _new_pool(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            timeout=self._http_timeout,
            headers=self.headers,
            verify=self._verify,
        )

    def close(self) -> None:
        self._http.close()

    def quick(self, timeout_s: float) -> ComfyClient:
        """A client of the same server, headers and client id whose requests wait at most
        ``timeout_s`` and are not repeated: for the cancel requests a stop sends, which a paused server
        must not hold for 30 s each (it takes them in when it resumes)."""
        return ComfyClient(
            self.base_url,
            client_id=self.client_id,
            http_timeout=timeout_s,
            headers=self.headers,
            retry=RetryPolicy(retries=0),
        )

    def retrying(
        self,
        what: str,
        operation: Callable[[], T],
        errors: tuple[type[Exception], ...],
        fail: Callable[[Exception, int], Exception],
        *,
        retry_timeouts: bool = False,
    ) -> T:
        """``operation()``, repeated after each of ``errors`` (a cut connection) as the retry policy
        and the deadline allow; when they do not, ``fail(error, attempts made)`` is raised. A timeout
        is repeated only with ``retry_timeouts`` (a download, whose server may have paused)."""
        attempt = 0
        while True:
            try:
                return operation()
            except errors as exc:
                if not self._retry_after(attempt, what, exc, retry_timeouts=retry_timeouts):
                    raise fail(exc, attempt + 1) from exc
                attempt += 1

    def _retry_after(
        self, attempt: int, what: str, error: Exception, *, retry_timeouts: bool = False
    ) -> bool:
        """After the network cut ``what`` (retry number ``attempt`` would be next, from 0): replace the
        connection pool, wait the backoff and return True; False when the retries or the deadline are
        used up, or for a timeout unless ``retry_timeouts``."""
        if attempt >= self.retry.retries or (
            isinstance(error, httpx.TimeoutException) and not retry_timeouts
        ):
            return False  # a timeout is no cut: the request already waited its whole timeout
        if isinstance(error, WebsocketRefused) or tls_problem(error, self.base_url):
            return False  # asked again, it is refused again
        delay = self.retry.delay(attempt, self._rng)
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            return False
        logger.info(
            "%s on %s failed (%s); retry %d in %.2f s", what, self.base_url, error, attempt + 1, delay
        )
        self._http.close()  # a pooled connection the peer closed must not be reused
        self._http = self._new_pool()
        time.sleep(delay)
        self.retries_made += 1
        return True

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request that is safe to repeat, retried on transport errors (see :mod:`.retry`)."""

        def fail(error: Exception, attempts: int) -> ServerError:
            tries = f" after {attempts} attempts" if attempts > 1 else ""
            if isinstance(error, GatewayAnswer):
                return ServerError(
                    f"{method} {self.base_url}{path}{tries} answered {self.describe(error.response)}",
                    status=error.response.status_code,
                )
            return ServerError(f"cannot reach ComfyUI at {self.base_url}{path}{tries}: {self._why(error)}")

        def once() -> httpx.Response:  # on the pool a retry renewed; no longer than the deadline leaves
            response = self._http.request(method, path, timeout=self._timeout_now(), **kwargs)
            if response.status_code in GATEWAY_STATUSES:
                raise GatewayAnswer(response)
            return response

        return self.retrying(f"{method} {path}", once, (httpx.TransportError, GatewayAnswer), fail)

    def describe(self, response: httpx.Response) -> str:
        """An unexpected answer's status and what it means (:func:`.answers.describe_answer`)."""
        return describe_answer(response, credentials=bool(self.headers), server=self.base_url)

    def _why(self, error: Exception) -> str:
        """What a failed request or handshake met, in words: an untrusted certificate, a forward proxy
        that does not answer, or :func:`.answers.failure_text`'s."""
        if (untrusted := tls_problem(error, self.base_url)) is not None:
            return untrusted
        said = failure_text(error)
        refused = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, ConnectionError))
        if refused and (proxy := forward_proxy(self.base_url)) is not None:
            said += f" (through the proxy {proxy} that the environment names; $no_proxy exempts a host)"
        return said

    def _timeout_now(self) -> float:
        """One request's timeout: ``http_timeout``, cut to what the deadline leaves (at least
        :data:`MIN_REQUEST_TIMEOUT_S`), so that a server that takes connections and never answers does
        not hold a ``--timeout 2`` run for 30 s."""
        if self.deadline is None:
            return self._http_timeout
        left = self.deadline - time.monotonic()
        return max(MIN_REQUEST_TIMEOUT_S, min(self._http_timeout, left))

    def __enter__(self) -> ComfyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plain HTTP -------------------------------------------------------------------------------

    def get_json(self, path: str, *, missing_ok: bool = False) -> Any:
        """GET ``path`` and decode the JSON answer; with ``missing_ok``, None when the server answers 404
        (a route of a node pack it does not load)."""
        response = self._request("GET", path)
        if missing_ok and response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ServerError(
                f"GET {self.base_url}{path} answered {self.describe(response)}", status=response.status_code
            )
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(
                f"GET {self.base_url}{path} did not answer JSON: {body_text(response)}"
            ) from exc

    def post_json(self, path: str, body: dict[str, Any]) -> None:
        """POST ``body`` as JSON to ``path``; a :class:`ServerError` when unreachable or not answered 2xx."""
        response = self._request("POST", path, json=body)
        if not response.is_success:
            raise ServerError(
                f"POST {self.base_url}{path} answered {self.describe(response)}", status=response.status_code
            )

    def submit(self, workflow: Workflow, prompt_id: str | None = None) -> str:
        """POST the workflow to ``/prompt``; returns the prompt id (ours, not the server's).

        Safe to repeat: when the network cuts the request, the prompt is sent again only if neither
        ``/queue`` nor ``/history`` knows the prompt id this client chose, so it is never queued twice.
        """
        prompt_id = prompt_id or str(uuid.uuid4())
        body = {"prompt": workflow, "client_id": self.client_id, "prompt_id": prompt_id}
        attempt = 0
        while True:
            try:
                response = self._http.post("/prompt", json=body, timeout=self._timeout_now())
                if response.status_code in GATEWAY_STATUSES:
                    raise GatewayAnswer(response)  # it may have reached ComfyUI: asked below, as a cut
                break
            except (httpx.TransportError, GatewayAnswer) as exc:
                if not self._retry_after(attempt, "POST /prompt", exc):
                    late = (  # the server may yet queue what it received
                        f"; if it comes back it may still run prompt {prompt_id}"
                        if isinstance(exc, (httpx.TimeoutException, GatewayAnswer))
                        else ""
                    )
                    why = (
                        f"answered {self.describe(exc.response)}"
                        if isinstance(exc, GatewayAnswer)
                        else self._why(exc)
                    )
                    raise ServerError(
                        f"cannot submit to ComfyUI at {self.base_url}/prompt: {why}{late}"
                    ) from exc
                attempt += 1
                time.sleep(SUBMIT_SETTLE_S)
                if self.is_queued(prompt_id) or self.history_entry(prompt_id) is not None:
                    logger.info(
                        "prompt %s reached %s before the cut; not sent again", prompt_id, self.base_url
                    )
                    return prompt_id
        if response.status_code == 400:
            raise rejection(response)
        if response.status_code != 200:
            raise ServerError(
                f"POST {self.base_url}/prompt answered {self.describe(response)}", status=response.status_code
            )
        return prompt_id

    def cancel(self, prompt_id: str) -> bool:
        """Remove ``prompt_id`` from the queue, then interrupt it if it is running (best effort);
        ``False`` when the server did not take both requests."""
        reached = True
        for path, body in (("/queue", {"delete": [prompt_id]}), ("/interrupt", {"prompt_id": prompt_id})):
            try:
                self._request("POST", path, json=body)
            except ServerError as exc:
                logger.warning("could not POST %s for %s: %s", path, prompt_id, exc)
                reached = False
        return reached

    def read_telemetry(self, prompt_id: str) -> dict[str, Any]:
        """Per-prompt peak VRAM / RSS / energy from the node pack's telemetry route, when present.

        Returns ``{"available": True, ...the route's fields}`` or ``{"available": False, "reason": …}``.
        """
        path = TELEMETRY_ROUTE.format(prompt_id=prompt_id)
        try:
            response = self._request("GET", path)
        except ServerError as exc:
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

    def _ws_url(self) -> str:
        return self.base_url.replace("http", "ws", 1) + f"/ws?clientId={self.client_id}"

    def connect_websocket(self, *, retry: bool = True) -> websocket.WebSocket:
        """Open the websocket (``/ws?clientId=…``); a handshake the network cuts is tried again as the
        retry policy allows, unless ``retry`` is False (a caller with a backoff loop of its own)."""
        header = [f"{key}: {value}" for key, value in self.headers.items()]

        def connect() -> websocket.WebSocket:
            try:
                sslopt = {"context": self._trust} if self._trust is not None else None
                return websocket.create_connection(self._ws_url(), timeout=1.0, header=header, sslopt=sslopt)
            except websocket.WebSocketBadStatusException as exc:
                if 400 <= exc.status_code < 500 and exc.status_code not in (408, 429):
                    raise WebsocketRefused(
                        f"{self.base_url}/ws refused the websocket ({exc.status_code}"
                        f"{status_reason(exc.status_code)}): the server, or a proxy in front of it "
                        "that does not pass websockets on"
                    ) from None
                raise

        def fail(error: Exception, attempts: int) -> ServerError:
            if isinstance(error, WebsocketRefused):
                return WebsocketRefused(str(error))
            if isinstance(error, websocket.WebSocketBadStatusException):  # a proxy's 502 that stays
                tries = f" {attempts} times" if attempts > 1 else ""
                return WebsocketRefused(
                    f"{self.base_url}/ws answered the websocket {error.status_code}"
                    f"{status_reason(error.status_code)}{tries}: a proxy in front of ComfyUI"
                )  # not the library's words: they hold the answer's headers (a cookie, say)
            return ServerError(f"cannot open the websocket of {self.base_url}: {self._why(error)}")

        if not retry:
            try:
                return connect()
            except (websocket.WebSocketException, OSError) as exc:
                raise fail(exc, 1) from exc
        return self.retrying("websocket handshake", connect, (websocket.WebSocketException, OSError), fail)

    def history_entry(self, prompt_id: str) -> dict[str, Any] | None:
        """The prompt's ``/history/{id}`` entry, or ``None`` while it is not written (yet)."""
        history = self.get_json(f"/history/{prompt_id}")
        return dict(history[prompt_id]) if isinstance(history, dict) and prompt_id in history else None

    def is_queued(self, prompt_id: str) -> bool:
        """Whether ``/queue`` lists the prompt as running or pending."""
        return self.queue_place(prompt_id) is not None

    def queue_place(self, prompt_id: str) -> str | None:
        """``"running"`` or ``"pending"`` as ``/queue`` lists the prompt; None when it does not."""
        queue = self.get_json("/queue")
        for key, place in (("queue_running", "running"), ("queue_pending", "pending")):
            if any(len(item) > 1 and item[1] == prompt_id for item in queue.get(key, [])):
                return place
        return None

    # -- files ------------------------------------------------------------------------------------

    def open_view(self, item: dict[str, Any]) -> AbstractContextManager[httpx.Response]:
        """Stream one output file (an entry of a node's ``images``/``gifs``/… list) from ``GET /view``.

        Use as a context manager; :func:`runner.tracking.outputs.download_outputs` writes, checks and
        hashes it.
        """
        params = {"filename": item["filename"], "subfolder": item.get("subfolder", ""), "type": item["type"]}
        # the file as it is: a proxy that compresses answers must not hand back its gzip of it
        return self._http.stream("GET", "/view", params=params, headers={"Accept-Encoding": "identity"})
