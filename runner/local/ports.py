"""Loopback ports for the servers: is one free, why not, and one the OS picks.

Example::

    port = pick_free_port()
    assert port_is_free("127.0.0.1", port)
"""

from __future__ import annotations

import socket


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (bound the way aiohttp binds, with SO_REUSEADDR)."""
    return bind_error(host, port) is None


def bind_error(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on (``errno.EADDRINUSE``: something listens there; other
    errors: the address is not this machine's, or not an address), or ``None`` when it can."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        return exc
    return None


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
