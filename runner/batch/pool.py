"""The ComfyUI servers one batch worker drives: K job slots each, health probes, backoff.

A job takes a slot with :meth:`ServerPool.acquire` (the least busy healthy server with a free slot;
it waits when there is none) and gives it back with :meth:`ServerPool.release`. A server is probed
(``GET /system_stats``) before its first job; one that fails a probe or a job (it stopped answering)
is taken out and probed again after 1, 2, 4 … up to ``max_backoff`` seconds, by whichever job is
waiting for a slot, and comes back in when a probe answers. ``headers`` (a proxy's ``--token`` and
``--header``) go with every request to the pool's servers, and to none other (:meth:`ServerPool.headers_for`);
they live in this process only, never in a job or a record.

Example::

    pool = ServerPool(["http://127.0.0.1:8188", "http://127.0.0.1:8189"], per_server=1)
    server = pool.acquire()
    try:
        ...  # run a prompt on it
    finally:
        pool.release(server)
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runner.errors import ServerError, UsageError
from runner.transport.answers import tls_problem
from runner.transport.client import ComfyClient
from runner.transport.retry import RetryPolicy
from runner.transport.server_url import same_server, server_key

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
WAIT_STEP_S = 0.5  # a waiting job looks again at least this often

NO_ANSWER = "no answer to GET /system_stats"

# True when the server answers; else False (said as NO_ANSWER) or why not, in words
Probe = Callable[[str], "bool | str"]


def probe_server(
    url: str, timeout: float = PROBE_TIMEOUT_S, *, headers: Mapping[str, str] | None = None
) -> bool | str:
    """True when ``url`` answers ``GET /system_stats`` within ``timeout`` seconds, else why not: a
    proxy's 401 or 403 and a certificate not trusted here are said as such (a wrong ``--token`` is no
    server that is down)."""
    try:
        with ComfyClient(url, http_timeout=timeout, retry=RetryPolicy(retries=0), headers=headers) as client:
            client.get_json("/system_stats")
    except ServerError as exc:
        logger.info("probe of %s failed: %s", url, exc)
        if exc.status in (401, 403, 407):
            return f"it answered {exc.status}: authentication refused; check --token/--header"
        if (untrusted := tls_problem(exc, url)) is not None:
            return untrusted
        if exc.status is not None:  # a redirect, a proxy's gateway page, a 404: said as it was answered
            return str(exc).replace(f"GET {url}/system_stats ", "", 1)
        return NO_ANSWER
    return True


@dataclass(frozen=True)
class ServerSnapshot:
    """One server as the pool sees it now."""

    url: str
    healthy: bool | None  # None: not probed yet
    running: int
    failures: int
    retry_in_s: float | None  # seconds to the next probe of a server that is out


class _State:
    def __init__(self, url: str) -> None:
        self.url = url
        self.healthy: bool | None = None
        self.running = 0
        self.failures = 0
        self.next_probe = 0.0
        self.probing = False
        self.out_since: float | None = None  # when it last went out (monotonic); None while in


class ServerPool:
    """Slots on a fixed set of servers; thread-safe. See the module docstring."""

    def __init__(
        self,
        urls: list[str],
        *,
        per_server: int = 1,
        probe: Probe | None = None,
        max_backoff: float = MAX_BACKOFF_S,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not urls:
            raise UsageError("a server pool needs at least one server")
        # a typo is said now (server_key checks each), not counted as a server that is down;
        # localhost and 127.0.0.1 are one
        if len({server_key(url) for url in urls}) != len(urls):
            raise UsageError(f"a server is listed twice: {urls}")
        if per_server < 1:
            raise UsageError(f"per_server must be ≥ 1, got {per_server}")
        self.per_server = per_server
        self._headers = dict(headers or {})
        self._probe = probe or functools.partial(probe_server, headers=self._headers)
        self._max_backoff = max_backoff
        self._states = {url: _State(url) for url in urls}
        self._cond = threading.Condition()

    @property
    def urls(self) -> list[str]:
        return list(self._states)

    def headers_for(self, url: str) -> dict[str, str]:
        """The headers to send to ``url``: the pool's for one of its servers, none for another (a
        prompt a worker of other servers left, found in a shared ``--out``)."""
        return dict(self._headers) if any(same_server(url, mine) for mine in self._states) else {}

    @property
    def slots(self) -> int:
        """Jobs this pool runs at once when every server is healthy."""
        return self.per_server * len(self._states)

    def acquire(self, stop: threading.Event | None = None) -> str:
        """A slot on the least busy healthy server; waits (probing servers that are out) until one is
        free, or raises :class:`ServerError` when ``stop`` is set first."""
        while True:
            with self._cond:
                due = self._due_for_probe(first_time=True)  # every server is probed before its first job
                best = self._free_server() if due is None else None
                if best is not None:
                    best.running += 1
                    return best.url
                due = due or self._due_for_probe()
                if due is None:
                    self._cond.wait(self._wait_time())
            if due is not None:
                self._run_probe(due)
            if stop is not None and stop.is_set():
                raise ServerError("stopped while waiting for a free server")

    def release(self, url: str, *, server_failed: bool = False, reason: str = "") -> None:
        """Give the slot back; ``server_failed`` takes the server out until a probe answers again."""
        with self._cond:
            state = self._states[url]
            state.running -= 1
            if server_failed:
                self._take_out(state, reason)
            self._cond.notify_all()

    def snapshot(self) -> list[ServerSnapshot]:
        now = time.monotonic()
        with self._cond:
            return [
                ServerSnapshot(
                    s.url,
                    s.healthy,
                    s.running,
                    s.failures,
                    max(0.0, s.next_probe - now) if s.healthy is False else None,
                )
                for s in self._states.values()
            ]

    def all_out_for(self) -> float | None:
        """Seconds for which every server has been out with no job on it (none answers, nothing runs),
        or ``None`` while one is in, not probed yet, or still holds a job."""
        with self._cond:
            states = list(self._states.values())
            if any(s.healthy is not False or s.running or s.out_since is None for s in states):
                return None
            return time.monotonic() - max(s.out_since for s in states if s.out_since is not None)

    def _free_server(self) -> _State | None:
        free = [s for s in self._states.values() if s.healthy and s.running < self.per_server]
        return min(free, key=lambda s: s.running, default=None)

    def _due_for_probe(self, *, first_time: bool = False) -> _State | None:
        now = time.monotonic()
        due = [
            s
            for s in self._states.values()
            if not s.healthy and not s.probing and s.next_probe <= now
            and (s.healthy is None or not first_time)
        ]  # fmt: skip
        if not due:
            return None
        state = min(due, key=lambda s: s.next_probe)
        state.probing = True
        return state

    def _wait_time(self) -> float:
        now = time.monotonic()
        waits = [s.next_probe - now for s in self._states.values() if not s.healthy and not s.probing]
        return max(0.01, min([WAIT_STEP_S, *waits]))

    def _run_probe(self, state: _State) -> None:
        answered = self._probe(state.url)
        with self._cond:
            state.probing = False
            if answered is True:
                if state.healthy is False:
                    logger.warning("server %s answers again; back in the pool", state.url)
                state.healthy, state.failures, state.out_since = True, 0, None
            else:
                self._take_out(state, answered or NO_ANSWER)
            self._cond.notify_all()

    def _take_out(self, state: _State, reason: str) -> None:
        state.failures += 1
        delay = min(self._max_backoff, FIRST_BACKOFF_S * 2 ** (state.failures - 1))
        # Said once when it goes out; each probe that finds it still out is a detail
        log = logger.info if state.healthy is False else logger.warning
        if state.healthy is not False:
            state.out_since = time.monotonic()
        state.healthy = False
        state.next_probe = time.monotonic() + delay
        log("server %s out (%s); next probe in %.0f s", state.url, reason, delay)
