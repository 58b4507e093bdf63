"""A loopback TCP proxy that cuts connections, to put in front of a real server.

Load balancers and proxies close connections under a client: after an idle or total timeout, or in the
middle of a response. :class:`CuttingProxy` forwards every connection to the target and cuts the k-th
one as ``schedule[k % len(schedule)]`` says: a :class:`Cut` after some seconds, after some bytes sent
back to the client (a small count cuts inside the response headers, a larger one inside a body), or
never. New connections always work, as they do behind such a proxy.

Example::

    with CuttingProxy(("127.0.0.1", 8188), [Cut(after_s=0.7), Cut(after_bytes=3000), Cut()]) as proxy:
        run_workflow(path, RunOptions(server=proxy.url))
    print(proxy.connections, proxy.cuts)
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cut:
    """When to cut one connection; both ``None``: never."""

    after_s: float | None = None  # close this long after the connection opened
    after_bytes: int | None = None  # close once this many bytes went from the server to the client


class CuttingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``, cutting connections by ``schedule``."""

    def __init__(self, target: tuple[str, int], schedule: Sequence[Cut]) -> None:
        if not schedule:
            raise ValueError("schedule needs at least one Cut (Cut() never cuts)")
        self.target = target
        self.schedule = tuple(schedule)
        self.connections = 0
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CuttingProxy:
        self._acceptor.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
        self._acceptor.join(timeout=5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                cut = self.schedule[self.connections % len(self.schedule)]
                self.connections += 1
                self._open |= {client, upstream}
            pair = _Pair(self, client, upstream, cut)
            if cut.after_s is not None:
                timer = threading.Timer(cut.after_s, pair.cut)
                timer.daemon = True
                timer.start()
            threading.Thread(target=pair.pump_up, daemon=True).start()
            threading.Thread(target=pair.pump_down, daemon=True).start()

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open -= set(socks)


class _Pair:
    """One proxied connection: client ⇄ upstream, cut once at most."""

    def __init__(self, proxy: CuttingProxy, client: socket.socket, upstream: socket.socket, cut: Cut) -> None:
        self.proxy, self.client, self.upstream, self.rule = proxy, client, upstream, cut
        self._done = threading.Event()

    def cut(self) -> None:
        if not self._done.is_set():
            with self.proxy._lock:
                self.proxy.cuts += 1
            self.close()

    def close(self) -> None:
        if not self._done.is_set():
            self._done.set()
            _close(self.client)
            _close(self.upstream)
            self.proxy._forget(self.client, self.upstream)

    def pump_up(self) -> None:
        """Client → server, unchanged."""
        with contextlib.suppress(OSError):
            while data := self.client.recv(65536):
                self.upstream.sendall(data)
        self.close()

    def pump_down(self) -> None:
        """Server → client, up to ``after_bytes`` when the rule says so."""
        budget = self.rule.after_bytes
        with contextlib.suppress(OSError):
            while data := self.upstream.recv(65536):
                if budget is not None and len(data) >= budget:
                    self.client.sendall(data[:budget])
                    self.cut()
                    return
                self.client.sendall(data)
                if budget is not None:
                    budget -= len(data)
        self.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
